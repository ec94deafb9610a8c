"""nbval: a chapter's kernel that dies while starting is started again.

With two xdist workers, two kernels start side by side; a kernel can die before it answers
``kernel_info`` for reasons outside the chapter (seen once in CI: every cell of one chapter
errored at setup, the other chapters passed). nbval sends the kernel's stderr to /dev/null, so
the cause was lost. Here each start keeps the kernel's stderr in a temporary file, a failed
start is retried (a warning shows it in the test summary with that stderr), and the last
failure raises with the stderr attached. A chapter that fails while *running* still fails.
"""

import tempfile
import warnings

import nbval.kernel

ATTEMPTS = 3
_start_new_kernel = nbval.kernel.start_new_kernel


def _tail(stream, limit=3000):
    stream.flush()
    stream.seek(0)
    return stream.read()[-limit:] or "(empty)"


def start_new_kernel_retrying(startup_timeout=60, kernel_name="python", **kwargs):
    for attempt in range(1, ATTEMPTS + 1):
        # the kernel process keeps its own descriptor; ours is closed (and the file
        # unlinked) when this attempt ends
        with tempfile.TemporaryFile(mode="w+") as stderr:
            kwargs["stderr"] = stderr
            try:
                return _start_new_kernel(
                    startup_timeout=startup_timeout, kernel_name=kernel_name, **kwargs
                )
            except RuntimeError as exc:
                message = f"{exc} (attempt {attempt} of {ATTEMPTS}); kernel stderr:\n"
                message += _tail(stderr)
                if attempt == ATTEMPTS:
                    raise RuntimeError(message) from exc
                warnings.warn(message, RuntimeWarning, stacklevel=2)


nbval.kernel.start_new_kernel = start_new_kernel_retrying
