#!/bin/sh
# The macOS app: dist/Homerack.app and dist/Homerack-VERSION-macos-ARCH.dmg, built on a Mac
# (Xcode command line tools, cmake, Python 3.10+ with its shared library, as python.org's
# installer and Homebrew provide). llama.cpp is built with Metal and every CPU variant of
# this architecture, each a module loaded at run time. Not built or run by the project's
# CI: see README, "Install the app".
set -eu
cd "$(dirname "$0")/.."
make setup  # .venv, llama-cpp-python (Metal) for its Python bindings, the starter models
.venv/bin/python -m pip install -q -r packaging/requirements-package.txt
HOMERACK_PORTABLE_CMAKE_ARGS="-DGGML_METAL=ON -DGGML_METAL_EMBED_LIBRARY=ON" \
    .venv/bin/python packaging/package.py
# Unsigned: a first start needs right-click > Open. To sign and notarize with your own
# Developer ID:
#   codesign --force --deep --options runtime -s "Developer ID Application: NAME" dist/Homerack.app
#   xcrun notarytool submit dist/Homerack-*.dmg --keychain-profile PROFILE --wait
#   xcrun stapler staple dist/Homerack-*.dmg
