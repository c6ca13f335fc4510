#!/usr/bin/env python3
"""Installs the Python client into a fresh virtual environment, as a user
would: the python_venv fixture of the python_client tests (CMakeLists.txt).

    install_venv.py VENV PACKAGE_DIR

Removes VENV, creates it with --system-site-packages (Debian's grpcio, numpy,
protobuf and pytest come from the interpreter running this script), and runs
``VENV/bin/python -m pip install --no-build-isolation --no-index PACKAGE_DIR``:
offline, with the interpreter's setuptools and wheel, ignoring this machine's
pip settings. Then imports matmul_client from VENV, from outside the
checkout, and prints where it came from and its version.
"""

import os
import shutil
import subprocess
import sys
from pathlib import Path


def main() -> int:
    if len(sys.argv) != 3:
        print(__doc__, file=sys.stderr)
        return 2
    venv, package = Path(sys.argv[1]).resolve(), Path(sys.argv[2]).resolve()
    shutil.rmtree(venv, ignore_errors=True)
    # Nothing of the checkout on sys.path, and pip as a plain machine has it:
    # no PIP_* settings or pip.conf (find-links, extra indexes) of this one.
    environment = {k: v for k, v in os.environ.items() if k != "PYTHONPATH" and not k.startswith("PIP_")}
    environment["PIP_CONFIG_FILE"] = os.devnull
    steps = [
        [sys.executable, "-m", "venv", "--system-site-packages", str(venv)],
        [str(venv / "bin" / "python"), "-m", "pip", "install", "--quiet", "--no-build-isolation",
         "--no-index", "--no-cache-dir", "--disable-pip-version-check", str(package)],
        [str(venv / "bin" / "python"), "-c",
         "import matmul_client; print('installed:', matmul_client.__file__, matmul_client.__version__)"],
    ]
    for step in steps:
        print("+", " ".join(step), flush=True)
        # From the venv's folder, so that nothing of the checkout is on sys.path.
        if subprocess.run(step, cwd=venv.parent, env=environment).returncode != 0:
            return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
