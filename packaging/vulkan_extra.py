"""llama.cpp's Vulkan backend beside the CPU build, for the tests that run Homerack on a
software GPU (Mesa's lavapipe, tests/engine/test_vulkan.py): llama-cpp-python built for
Vulkan (gpu_toolchain.py: the distribution's glslc, libvulkan-dev and spirv-headers, newer
headers where they are old) and installed into build/llama-vulkan/, which a child process
puts first on its PYTHONPATH. The wheel is cached as the CPU build's is (first build: about
20 minutes on 2 cores, most of it Vulkan's shaders).

    .venv/bin/python packaging/vulkan_extra.py      (make test runs it)

Without the build tools or a Vulkan driver it says so, and those tests skip.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import gpu_toolchain as gpu
import llama_backend as lb

TARGET = Path(__file__).resolve().parents[1] / "build" / "llama-vulkan"
ICDS = ("/usr/share/vulkan/icd.d", "/etc/vulkan/icd.d")


def lavapipe() -> bool:
    """Mesa's software Vulkan driver is installed."""
    return any(p.name.startswith("lvp_icd") for d in ICDS if Path(d).is_dir()
               for p in Path(d).iterdir())


def main() -> int:
    missing = gpu.vulkan_build_tools()
    if missing or not lavapipe():
        why = f"Vulkan's build tools are missing ({missing})" if missing else \
            "Mesa's software Vulkan driver (mesa-vulkan-drivers) is missing"
        print(f"{why}: the tests on a software GPU will be skipped "
              f"(apt install {gpu.VULKAN_PACKAGES})")
        return 0
    build = lb.candidates("vulkan", lb.cpu_features())[0]
    stamp = TARGET / ".homerack-llama.json"
    if stamp.exists() and json.loads(stamp.read_text()) == build.stamp():
        print(f"llama.cpp for Vulkan already in {TARGET} ({build.describe()})")
        return 0
    wheel = lb.build_wheel(build, lb.cache_dir(build))
    shutil.rmtree(TARGET, ignore_errors=True)
    subprocess.run([sys.executable, "-m", "pip", "install", "--disable-pip-version-check", "-q",
                    "--no-deps", "--target", str(TARGET), str(wheel)], check=True)
    stamp.write_text(json.dumps(build.stamp()))
    print(f"llama.cpp for Vulkan installed into {TARGET} ({build.describe()})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
