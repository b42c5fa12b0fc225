"""Build, ahead of use, the DeepSpeed ops that interlock's DeepSpeed tests and suite use
on the CPU accelerator: the shared-memory collective, pinned memory and the
asynchronous I/O op of NVMe offloading.

DeepSpeed compiles each op the first time a process loads it (about three minutes for
async_io on two cores) and caches it under ``TORCH_EXTENSIONS_DIR``. ``nox -s deepspeed``
runs this as an install step, so ``nox -s deepspeed --install-only`` can build the ops
in the background while other work runs, and the tests then load them from the cache.
An op this machine cannot build (async_io without libaio) is reported and left to the
test that needs it, which skips with the reason.

    python tools/build_deepspeed_ops.py
"""

from __future__ import annotations

import sys
import time

#: the op builders the CPU runner loads, in the order the tests first need them
BUILDERS = ("ShareMemCommBuilder", "PinMemoryBuilder", "AsyncIOBuilder")


def main() -> int:
    try:
        from deepspeed.accelerator import get_accelerator
    except ImportError as error:
        print(f"build_deepspeed_ops: deepspeed is not installed ({error})", file=sys.stderr)
        return 1
    accelerator = get_accelerator()
    failed = []
    for name in BUILDERS:
        builder = accelerator.create_op_builder(name)
        if builder is None or not builder.is_compatible(verbose=False):
            print(f"build_deepspeed_ops: {name}: cannot build here, left to its test")
            continue
        started = time.monotonic()
        try:
            builder.load(verbose=False)
        except Exception as error:  # a compiler error: the test that loads it says more
            failed.append(name)
            print(f"build_deepspeed_ops: {name} failed: {type(error).__name__}: {error}",
                  file=sys.stderr)
            continue
        print(f"build_deepspeed_ops: {name} ready in {time.monotonic() - started:.0f} s")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
