"""`make package-test`: the packaged app run as a new user would run it.

Each check runs the bundle's own executable, unpacked from the .tar.gz into a fresh
folder, with a fresh HOMERACK_HOME (no models, no settings) and an environment without
this checkout's Python (no virtual environment on PATH, no PYTHONPATH):

1. `homerack hardware` names the CPU variant the loader chose;
2. `homerack self-test`: the engine started from the bundle, the starter model linked
   from it (no download) and loaded, a question answered; time from launch to first token;
3. a variant below this CPU's best, forced with HOMERACK_CPU_VARIANT, still answers;
4. the Vulkan module: on this machine's Vulkan device (Mesa's lavapipe here), `homerack
   hardware` names it and the self-test's starter runs its layers there;
5. `homerack worker` starts its llama.cpp RPC server (`homerack -m engine.llama.rpc`);
6. the desktop window under Xvfb: the starter model ready to chat, a question typed
   into it answered, a screenshot saved;
7. the .deb holds /opt/homerack, /usr/bin/homerack, the desktop entry and icons, and
   the app unpacked from it runs.

Prints the sizes and timings; exit status 0 when every check passed.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import tarfile
import tempfile
import time
from pathlib import Path

from package import DIST, ROOT, folder_size

OUT = ROOT / "build" / "package-test"
QUESTION = "What is the capital of France?"


class Failed(Exception):
    pass


def clean_env(home: Path, **extra: str) -> dict:
    """A user's environment: this checkout's Python and venv out of sight."""
    venv = str(ROOT / ".venv")
    path = [p for p in os.environ.get("PATH", "").split(os.pathsep) if not p.startswith(venv)]
    env = {k: v for k, v in os.environ.items()
           if k not in ("PYTHONPATH", "PYTHONHOME", "VIRTUAL_ENV", "HOMERACK_TOKEN")}
    return dict(env, PATH=os.pathsep.join(path), HOMERACK_HOME=str(home), **extra)


def run(argv: list[str], env: dict, timeout: float = 300) -> str:
    done = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=timeout,
                          cwd=tempfile.gettempdir())
    output = done.stdout + done.stderr
    if done.returncode:
        raise Failed(f"{' '.join(argv[1:])} exited {done.returncode}:\n{output[-2500:]}")
    return output


def unpack(archive: Path, into: Path) -> Path:
    with tarfile.open(archive) as tar:
        tar.extractall(into, filter="tar")
    return into / "homerack" / "homerack"


def check_hardware(exe: Path, home: Path) -> str:
    out = run([str(exe), "hardware"], clean_env(home))
    line = next((l for l in out.splitlines() if l.startswith("llama.cpp CPU backend:")), "")
    if "portable build" not in line:
        raise Failed(f"hardware does not name a portable CPU variant:\n{out}")
    return line.split(": ", 1)[1]


def check_self_test(exe: Path, home: Path, **extra: str) -> tuple[str, float]:
    out = run([str(exe), "self-test"], clean_env(home, QT_QPA_PLATFORM="offscreen", **extra))
    answer = re.search(r"answer from \S+: (.*)", out)
    first = re.search(r"first token ([\d.]+) s after launch", out)
    if not (answer and first):
        raise Failed(f"self-test printed no answer:\n{out}")
    return answer.group(1), float(first.group(1))


def lower_variant(exe: Path, chosen: str) -> str:
    """The most basic variant of the bundle's (x64 on x86-64), when it is not the best."""
    lib = exe.parent / "_internal" / "llama_cpp" / "lib"
    variants = sorted(p.stem.removeprefix("libggml-cpu-") for p in lib.glob("libggml-cpu-*.so"))
    basic = [v for v in ("x64", "sse42", "armv8.0_1") if v in variants and v != chosen]
    if not basic:
        raise Failed(f"no variant below {chosen} among {variants}")
    return basic[0]


def check_forced(exe: Path, home: Path, variant: str) -> tuple[str, float]:
    out = run([str(exe), "hardware"], clean_env(home, HOMERACK_CPU_VARIANT=variant))
    if f"CPU backend: {variant} (forced" not in out:
        raise Failed(f"hardware does not say {variant} was forced:\n{out}")
    return check_self_test(exe, home, HOMERACK_CPU_VARIANT=variant)


def check_vulkan(exe: Path, home: Path) -> str:
    """The bundle's Vulkan module on this machine's Vulkan device (Mesa's lavapipe here,
    listed by llama.cpp only when asked: GGML_VK_VISIBLE_DEVICES): named by `hardware`,
    the starter's layers on it, an answer."""
    lib = exe.parent / "_internal" / "llama_cpp" / "lib"
    if not (lib / "libggml-vulkan.so").exists():
        raise Failed(f"the bundle has no Vulkan module in {lib}")
    env = {"GGML_VK_VISIBLE_DEVICES": "0"}
    out = run([str(exe), "hardware"], clean_env(home, **env))
    device = next((line for line in out.splitlines() if line.startswith("Vulkan0")), None)
    if device is None:
        raise Failed(f"hardware names no Vulkan device (is mesa-vulkan-drivers installed?):\n{out}")
    out = run([str(exe), "self-test"], clean_env(home, QT_QPA_PLATFORM="offscreen", **env))
    ran = re.search(r"the model ran on: (.*)", out)
    if not ran or "on GPU" not in ran.group(1):
        raise Failed(f"the starter did not run on the Vulkan device:\n{out}")
    return f"{' '.join(device.split())}; {ran.group(1)}"


def check_cuda(exe: Path, home: Path) -> str:
    """The bundle's CUDA module, refused cleanly where it cannot run (no NVIDIA driver
    here), and its runtime fetched from the index as a user's first use would: checked
    against the sha256 the bundle was built with."""
    lib = exe.parent / "_internal" / "llama_cpp" / "lib"
    if not (lib / "libggml-cuda.so").exists() or not (lib / "cuda-runtime.json").exists():
        raise Failed(f"the bundle has no CUDA module (or its runtime manifest) in {lib}")
    out = run([str(exe), "hardware"], clean_env(home))
    refused = next((line for line in out.splitlines() if "CUDA module not loaded" in line), None)
    if refused is None:
        raise Failed(f"hardware does not say why the CUDA module stayed out:\n{out}")
    said = subprocess.run([str(exe), "gpu-runtime"], env=clean_env(home), capture_output=True,
                          text=True, timeout=60)
    if said.returncode != 1 or "is not fetched" not in said.stdout:
        raise Failed(f"gpu-runtime before a fetch:\n{said.stdout}{said.stderr}")
    started = time.monotonic()
    fetched = run([str(exe), "gpu-runtime", "--fetch"], clean_env(home), timeout=1800)
    took = time.monotonic() - started
    runtime = next(home.glob("cache/gpu-runtime/cuda-runtime-*"))
    size = sum(p.stat().st_size for p in runtime.iterdir())
    if "runtime is here" not in fetched:
        raise Failed(f"gpu-runtime --fetch:\n{fetched}")
    # the runtime is loaded before the backends now (it loads without a driver); the
    # module still stays out, for the driver
    again = run([str(exe), "hardware"], clean_env(home))
    if refused not in again:
        raise Failed(f"hardware with the runtime fetched:\n{again}")
    module = (lib / "libggml-cuda.so").stat().st_size / 2**20
    return (f"module {module:.0f} MiB; {refused.strip()}; runtime fetched and checked in "
            f"{took:.0f} s ({size / 2**20:.0f} MiB kept), loaded before the backends")


def check_speech(exe: Path, home: Path) -> str:
    """eSpeak NG from the bundle, in its own child as the engine starts it: a sentence
    spoken (its library and voices once missed the bundle, and the window said the
    engine could not start)."""
    request = json.dumps({"text": "Hello from the bundle.", "voice": "en-us", "speed": 1.0})
    done = subprocess.run([str(exe), "-m", "engine.voice.espeak", str(512 << 20)],
                          input=request.encode() + b"\n", capture_output=True, timeout=60,
                          env=clean_env(home), cwd=tempfile.gettempdir())
    head, _, samples = done.stdout.partition(b"\n")
    try:
        said = json.loads(head)
    except ValueError:
        raise Failed(f"the speech child answered no JSON (exit {done.returncode}):\n"
                     f"{done.stderr.decode(errors='replace')[-1500:]}") from None
    if not said.get("bytes") or len(samples) < said["bytes"]:
        raise Failed(f"the speech child spoke nothing: {said}")
    return f"{said['bytes'] // 2 / said['rate']:.1f} s of speech at {said['rate']} Hz"


def check_worker(exe: Path, home: Path) -> str:
    worker = subprocess.Popen([str(exe), "worker", "--host", "127.0.0.1", "--port", "0",
                               "--code", "246810", "--no-advertise"],
                              env=clean_env(home), stdout=subprocess.PIPE,
                              stderr=subprocess.STDOUT, text=True)
    try:
        lines = []
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and not any("pairing code" in l for l in lines):
            line = worker.stdout.readline()
            if not line:
                break
            lines.append(line.strip())
        rpc = []
        while time.monotonic() < deadline and not rpc:
            rpc = subprocess.run(["pgrep", "-f", f"{exe} -m engine.llama.rpc"], capture_output=True,
                                 text=True).stdout.split()
            time.sleep(0.5)
        if not rpc or worker.poll() is not None:
            raise Failed("the worker did not start its RPC server:\n" + "\n".join(lines))
        return next(line for line in lines if "listening on" in line)
    finally:
        worker.terminate()
        worker.wait(30)


def check_window(exe: Path, home: Path, screenshot: Path) -> str:
    if not shutil.which("xvfb-run"):
        raise Failed("xvfb-run is not installed (apt install xvfb)")
    out = run(["xvfb-run", "-a", "-s", "-screen 0 1280x800x24", str(exe), "self-test",
               "--gui", str(screenshot)], clean_env(home), timeout=300)
    return " / ".join(l for l in out.splitlines() if "window" in l)


def check_deb(deb: Path, into: Path) -> str:
    listing = subprocess.run(["dpkg-deb", "-c", str(deb)], capture_output=True, text=True,
                             check=True).stdout
    wanted = ["./opt/homerack/homerack", "./usr/bin/homerack -> /opt/homerack/homerack",
              "./usr/share/applications/homerack.desktop",
              "./usr/share/icons/hicolor/scalable/apps/homerack.svg",
              "./usr/share/icons/hicolor/256x256/apps/homerack.png"]
    missing = [w for w in wanted if w not in listing]
    if missing:
        raise Failed(f"the .deb lacks {missing}")
    subprocess.run(["dpkg-deb", "-x", str(deb), str(into)], check=True)
    out = run([str(into / "opt" / "homerack" / "homerack"), "--help"], clean_env(into / "home"))
    if "self-test" not in out:
        raise Failed(f"the app unpacked from the .deb does not run:\n{out}")
    depends = subprocess.run(["dpkg-deb", "-f", str(deb), "Depends"], capture_output=True,
                             text=True).stdout.strip()
    return f"Depends: {depends}"


def main() -> int:
    tarballs = sorted(DIST.glob("homerack-*-linux-*.tar.gz"))
    debs = sorted(DIST.glob("homerack_*.deb"))
    if not tarballs:
        raise SystemExit("no dist/homerack-*.tar.gz: run `make package` first")
    shutil.rmtree(OUT, ignore_errors=True)
    OUT.mkdir(parents=True)
    exe = unpack(tarballs[-1], OUT / "unpacked")
    results, failed = [], 0

    def check(name: str, action) -> None:
        nonlocal failed
        started = time.monotonic()
        try:
            detail = action()
            results.append(f"PASS  {name} ({time.monotonic() - started:.0f} s): {detail}")
        except (Failed, subprocess.SubprocessError, OSError) as exc:
            failed += 1
            results.append(f"FAIL  {name}: {exc}")
        print(results[-1], flush=True)

    state: dict = {}
    check("hardware names the CPU variant",
          lambda: state.setdefault("variant", check_hardware(exe, OUT / "home-hardware")))
    chosen = state.get("variant", "").split(" ")[0]

    def first_launch():
        answer, first = check_self_test(exe, OUT / "home-first")
        state["first"] = first
        return f"{answer}; first token {first:.1f} s after launch (no models installed before)"

    check("self-test, first launch", first_launch)

    def second_launch():
        answer, first = check_self_test(exe, OUT / "home-first")
        state["again"] = first
        return f"{answer}; first token {first:.1f} s after launch"

    check("self-test, second launch", second_launch)

    def forced():
        variant = lower_variant(exe, chosen)
        answer, first = check_forced(exe, OUT / "home-forced", variant)
        return f"{variant} forced; {answer}; first token {first:.1f} s"

    check("a lower CPU variant answers", forced)
    check("the Vulkan module on a Vulkan device", lambda: check_vulkan(exe, OUT / "home-vulkan"))
    check("speech (eSpeak NG) from the bundle", lambda: check_speech(exe, OUT / "home-speech"))
    check("the CUDA module, without a driver", lambda: check_cuda(exe, OUT / "home-cuda"))
    check("homerack worker runs from the bundle", lambda: check_worker(exe, OUT / "home-worker"))
    check("the window under Xvfb",
          lambda: check_window(exe, OUT / "home-window", OUT / "window.png"))
    if debs:
        check("the .deb", lambda: check_deb(debs[-1], OUT / "deb-root"))
    else:
        results.append("FAIL  the .deb: none in dist/")
        failed += 1
    bundle = OUT / "unpacked" / "homerack"
    size = folder_size(bundle)
    print()
    print(f"bundle {size / 2**20:.0f} MiB unpacked; tar.gz {tarballs[-1].stat().st_size / 2**20:.0f} MiB"
          + (f"; .deb {debs[-1].stat().st_size / 2**20:.0f} MiB" if debs else ""))
    if "first" in state:
        print(f"launch to first token: {state['first']:.1f} s on first launch, "
              f"{state.get('again', float('nan')):.1f} s after")
    print(f"{len(results) - failed} passed, {failed} failed")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
