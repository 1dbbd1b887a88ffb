"""Host costs for any device: a real engine's own host phases timed with the model's forward
stubbed (:mod:`calibrate.host.sglang`), the yardstick that moves them from the host they were
timed on to another (:mod:`calibrate.host.yardstick`), and a device profile built from a device's
forward curves and those host costs (:mod:`calibrate.host.compose`, ``overlap-sim compose``)."""
