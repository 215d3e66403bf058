#!/usr/bin/env bash
# Makes sure a Vulkan driver is present for the gpu backend's tests: does nothing when one is
# installed; otherwise installs Mesa's lavapipe (a software Vulkan driver) with apt-get as
# root (or through sudo), or, without privileges, unpacks the Debian packages into
# ~/.cache/inferno-vulkan and writes an env file there that points the Vulkan loader at them.
set -euo pipefail

packages="mesa-vulkan-drivers libvulkan1"

have_driver() {
    [ -n "${VK_ICD_FILENAMES:-}" ] && return 0
    compgen -G '/usr/share/vulkan/icd.d/*.json' >/dev/null \
        || compgen -G '/etc/vulkan/icd.d/*.json' >/dev/null \
        || return 1
    [[ "$(ldconfig -p 2>/dev/null)" == *libvulkan.so.1* ]]
}

if have_driver && [ -z "${INFERNO_VULKAN_UNPACK:-}" ]; then
    exit 0
fi

apt_install() {
    # shellcheck disable=SC2086 # the list is split on purpose
    "$@" apt-get install -y --no-install-recommends $packages >/dev/null \
        || { "$@" apt-get update >/dev/null && "$@" apt-get install -y --no-install-recommends $packages >/dev/null; }
}

if [ -n "${INFERNO_VULKAN_UNPACK:-}" ]; then
    : # asked to unpack even where packages could be installed (to test that path)
elif [ "$(id -u)" = 0 ]; then
    echo "installing Mesa's software Vulkan driver (lavapipe)" >&2
    DEBIAN_FRONTEND=noninteractive apt_install env
elif command -v sudo >/dev/null && sudo -n true 2>/dev/null; then
    echo "installing Mesa's software Vulkan driver (lavapipe) with sudo" >&2
    apt_install sudo -n env DEBIAN_FRONTEND=noninteractive
fi
if [ -n "${INFERNO_VULKAN_UNPACK:-}" ] || ! have_driver; then
    cache="$HOME/.cache/inferno-vulkan"
    echo "unpacking Mesa's software Vulkan driver (lavapipe) into $cache" >&2
    mkdir -p "$cache/debs" "$cache/root"
    (cd "$cache/debs" && apt-get download $packages libllvm15 libz3-4 >/dev/null)
    for deb in "$cache"/debs/*.deb; do
        dpkg-deb -x "$deb" "$cache/root"
    done
    icd="$(ls "$cache"/root/usr/share/vulkan/icd.d/lvp_icd.*.json | head -n 1)"
    libdir="$(dirname "$(find "$cache/root" -name 'libvulkan.so.1' | head -n 1)")"
    # The ICD names its library by absolute path; point it into the unpacked tree.
    sed -i "s|\"library_path\": \"/|\"library_path\": \"$cache/root/|" "$icd"
    {
        echo "export VK_ICD_FILENAMES=\"$icd\""
        echo "export LD_LIBRARY_PATH=\"$libdir:$cache/root/usr/lib/x86_64-linux-gnu:\${LD_LIBRARY_PATH:-}\""
    } > "$cache/env"
fi
