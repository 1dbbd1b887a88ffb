"""The forward passes calibration times: one Llama-style decoder in torch
(:mod:`~calibrate.forward.torch_model`) and MLX (:mod:`~calibrate.forward.mlx_model`) with the
same random weights (:mod:`~calibrate.forward.weights`), and the backends that time its
forwards with the scheduler's bookkeeping around them (:mod:`~calibrate.forward.torch_backend`,
:mod:`~calibrate.forward.mlx_backend`). torch and MLX are imported only by these modules.
"""
