#!/usr/bin/env bash
# Builds the Debian package target/debian/wirelane_VERSION_ARCH.deb with dpkg-deb:
# wirelane and wirelane-lab, their man pages and bash/zsh completions (generated from
# the clap definitions by the binaries themselves), the systemd template units
# wirelane@.service and wirelane-pool@.service, the README, a changelog and the
# copyright file, and maintainer scripts that tell systemd its units changed (running
# tunnels are left alone). Prints the package's path.
set -euo pipefail
cd "$(dirname "$0")/.."
export PATH="$HOME/.cargo/bin:$PATH"

cargo build --release --locked -p wirelane -p wirelane-lab >&2
version=$(sed -n 's/^version = "\(.*\)"/\1/p' Cargo.toml | head -1)
arch=$(dpkg --print-architecture)
out=target/debian
root=$out/root
rm -rf "$root"
mkdir -p "$root/DEBIAN"

install -Dm755 target/release/wirelane "$root/usr/bin/wirelane"
install -Dm755 target/release/wirelane-lab "$root/usr/bin/wirelane-lab"
strip --strip-unneeded "$root/usr/bin/wirelane" "$root/usr/bin/wirelane-lab"
mkdir -p "$root/usr/share/man/man8" "$root/usr/share/man/man1" \
    "$root/usr/share/bash-completion/completions" "$root/usr/share/zsh/vendor-completions"
target/release/wirelane --generate man | gzip -9n >"$root/usr/share/man/man8/wirelane.8.gz"
target/release/wirelane-lab generate man | gzip -9n >"$root/usr/share/man/man1/wirelane-lab.1.gz"
target/release/wirelane --generate complete-bash >"$root/usr/share/bash-completion/completions/wirelane"
target/release/wirelane-lab generate complete-bash >"$root/usr/share/bash-completion/completions/wirelane-lab"
target/release/wirelane --generate complete-zsh >"$root/usr/share/zsh/vendor-completions/_wirelane"
target/release/wirelane-lab generate complete-zsh >"$root/usr/share/zsh/vendor-completions/_wirelane-lab"
install -Dm644 packaging/wirelane@.service "$root/lib/systemd/system/wirelane@.service"
install -Dm644 packaging/wirelane-pool@.service "$root/lib/systemd/system/wirelane-pool@.service"
install -Dm644 README.md "$root/usr/share/doc/wirelane/README.md"
install -Dm644 packaging/copyright "$root/usr/share/doc/wirelane/copyright"
# The changelog: the commit the package was built from, dated by it.
commit=$(git rev-parse --short HEAD 2>/dev/null || echo unknown)
date=$(git log -1 --format=%aD 2>/dev/null || date -R)
printf 'wirelane (%s) unstable; urgency=medium\n\n  * Built from commit %s.\n\n -- wirelane developers <wirelane@localhost>  %s\n' \
    "$version" "$commit" "$date" | gzip -9n >"$root/usr/share/doc/wirelane/changelog.gz"
chmod 644 "$root/usr/share/doc/wirelane/changelog.gz"
# Units changed on disk: systemd rereads them. No instance is restarted on upgrade: a
# restart would take the tunnels down. Not when installed into another root
# (DPKG_ROOT): that root's systemd is not this one.
cat >"$root/DEBIAN/postinst" <<'SCRIPT'
#!/bin/sh
set -e
if [ -z "${DPKG_ROOT:-}" ] && [ -d /run/systemd/system ]; then
    systemctl --system daemon-reload >/dev/null || true
fi
SCRIPT
# Purge: the instances enabled at boot are forgotten (their links in *.wants), as
# debhelper forgets a unit's enablement on purge, not on removal: removed and installed
# again, the package starts the same tunnels at boot.
cat >"$root/DEBIAN/postrm" <<'SCRIPT'
#!/bin/sh
set -e
if [ "$1" = purge ] && [ -z "${DPKG_ROOT:-}" ]; then
    find /etc/systemd/system \( -path '*.wants/wirelane@*.service' \
        -o -path '*.wants/wirelane-pool@*.service' \) -type l -delete 2>/dev/null || true
fi
if [ -z "${DPKG_ROOT:-}" ] && [ -d /run/systemd/system ]; then
    systemctl --system daemon-reload >/dev/null || true
fi
SCRIPT
chmod 755 "$root/DEBIAN/postinst" "$root/DEBIAN/postrm"
# Removal (not an upgrade): the tunnels the package's units run go down with it. Tunnel
# units stop before the pools they are bound to (their After=).
cat >"$root/DEBIAN/prerm" <<'SCRIPT'
#!/bin/sh
set -e
if [ "$1" = remove ] && [ -z "${DPKG_ROOT:-}" ] && [ -d /run/systemd/system ]; then
    running=$(systemctl list-units --all --plain --no-legend \
        'wirelane@*.service' 'wirelane-pool@*.service' | awk '{print $1}')
    if [ -n "$running" ]; then
        systemctl stop $running || true
    fi
fi
SCRIPT
chmod 755 "$root/DEBIAN/prerm"

cat >"$root/DEBIAN/control" <<CONTROL
Package: wirelane
Version: $version
Architecture: $arch
Maintainer: wirelane developers <wirelane@localhost>
Installed-Size: $(du -sk --exclude=DEBIAN "$root" | cut -f1)
Depends: libc6 (>= 2.34), libgcc-s1, wireguard-tools, iproute2
Section: net
Priority: optional
Description: multi-core user-space WireGuard daemon
 wirelane is a WireGuard data plane in user space, a drop-in for wireguard-go:
 wg, wg-quick (WG_QUICK_USERSPACE_IMPLEMENTATION=wirelane) and the systemd
 unit wirelane@.service work unchanged. It runs the pipeline's stages on one
 pool of workers for every tunnel, and serves Prometheus metrics on request.
 .
 wirelane-lab, included, measures WireGuard implementations side by side in
 network namespaces.
CONTROL
(cd "$root" && find . -path ./DEBIAN -prune -o -type f -printf '%P\0' | sort -z \
    | xargs -0 md5sum) >"$root/DEBIAN/md5sums"

deb="$out/wirelane_${version}_${arch}.deb"
dpkg-deb --root-owner-group -Zxz --build "$root" "$deb" >&2
echo "$deb"
