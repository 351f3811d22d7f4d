#!/bin/sh
# Debian's Chromium, for the viewer's end-to-end tests (driven by Playwright's Python package,
# which is in the dev extra; `playwright install` is never needed). Safe to run again.
set -e
for candidate in "${TOOLSELF_CHROMIUM:-}" /usr/bin/chromium /usr/bin/chromium-browser; do
    if [ -n "$candidate" ] && [ -x "$candidate" ]; then
        echo "chromium: $candidate"
        exit 0
    fi
done
if [ "$(id -u)" = "0" ]; then
    SUDO=""
elif command -v sudo >/dev/null 2>&1 && sudo -n true 2>/dev/null; then
    SUDO="sudo -n"
else
    echo "chromium is missing and cannot be installed without root: apt-get install chromium" >&2
    exit 1
fi
if ! command -v apt-get >/dev/null 2>&1; then
    echo "chromium is missing and this system has no apt-get: install Chromium and set TOOLSELF_CHROMIUM" >&2
    exit 1
fi
export DEBIAN_FRONTEND=noninteractive
$SUDO apt-get update -qq
$SUDO apt-get install -y -qq --no-install-recommends chromium
echo "chromium: /usr/bin/chromium"
