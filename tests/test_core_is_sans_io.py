from __future__ import annotations

import json
import subprocess
import sys

IO_PACKAGES = ["asyncio", "anyio", "httpx", "starlette", "uvicorn"]


def test_importing_the_core_imports_no_io_package() -> None:
    code = (
        "import json, pkgutil, sys, importlib, sluicegate.core as core\n"
        "for m in pkgutil.walk_packages(core.__path__, 'sluicegate.core.'):\n"
        "    importlib.import_module(m.name)\n"
        f"print(json.dumps([n for n in {IO_PACKAGES!r} if n in sys.modules]))\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True
    )
    assert json.loads(result.stdout) == []
