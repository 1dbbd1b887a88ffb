"""The command-line flags of an engine's own server launcher, read from its argument parser.

    .venvs/sglang/bin/python -m realengines.flags sglang OUT.json
    .venvs/vllm/bin/python -m realengines.flags vllm OUT.json

(run from the repository root in the engine's environment). SGLang: the parser of
``python -m sglang.launch_server`` (``ServerArgs.add_cli_args``, ``srt/server_args.py``); vLLM:
the OpenAI server's (``make_arg_parser``, ``entrypoints/launchers/cli_args.py``, which adds
``EngineArgs``' flags). OUT gets ``{"engine", "version", "flags": {option: {"dest", "value",
"choices"}}}``, ``value`` false for a flag that takes none (``store_true`` and the like),
``choices`` (where the parser has them for an untyped flag) the values it accepts. The simulator's launch-
argument readers refuse a flag not in the list, as the engine's parser would
(:mod:`sim.engines.sglang.rules.launch_args`, :mod:`sim.engines.vllm.rules.launch_args`).
"""

from __future__ import annotations

import argparse
import json
import sys


def _parser(engine: str) -> tuple[argparse.ArgumentParser, str]:
    if engine == "sglang":
        import sglang
        from sglang.srt.server_args import ServerArgs

        parser = argparse.ArgumentParser()
        ServerArgs.add_cli_args(parser)
        return parser, sglang.__version__
    import vllm
    from vllm.entrypoints.launchers.cli_args import make_arg_parser
    from vllm.utils.argparse_utils import FlexibleArgumentParser

    return make_arg_parser(FlexibleArgumentParser()), vllm.__version__


def flags(engine: str) -> dict:
    parser, version = _parser(engine)
    out = {}
    for action in parser._actions:
        for opt in action.option_strings:
            if opt in ("-h", "--help"):
                continue
            out[opt] = {"dest": action.dest, "value": action.nargs != 0}
            # the values the parser accepts, where they are plain strings compared as given
            # (argparse checks a value against choices after its type: only untyped flags)
            if action.choices is not None and action.type in (None, str) and \
                    all(isinstance(c, str) for c in action.choices):
                out[opt]["choices"] = sorted(action.choices)
    return {"engine": engine, "version": version, "flags": dict(sorted(out.items()))}


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if len(argv) != 2 or argv[0] not in ("sglang", "vllm"):
        sys.exit("usage: python -m realengines.flags sglang|vllm OUT.json")
    with open(argv[1], "w") as f:
        json.dump(flags(argv[0]), f, indent=0, sort_keys=False)
        f.write("\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
