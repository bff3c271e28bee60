#!/usr/bin/env bash
# The Debian package, built from this tree and checked with the real tools: it
# installs with dpkg into a scratch root (so the machine is not touched), the
# installed wirelane answers --version and its man page renders, systemd-analyze
# accepts the unit, the package declares what it needs, and dpkg -r removes every
# file it installed.
set -euo pipefail
cd "$(dirname "$0")/.."

deb=$(bash scripts/package.sh)
echo "package: $deb"
dpkg-deb -c "$deb"

root=$(mktemp -d /tmp/wirelane-pkg.XXXXXX)
trap 'rm -rf "$root" "${units:-}"' EXIT
mkdir -p "$root/var/lib/dpkg/info" "$root/var/lib/dpkg/updates"
touch "$root/var/lib/dpkg/status"
fail() { echo "package test: $*" >&2; exit 1; }

depends=$(dpkg-deb -f "$deb" Depends)
for d in wireguard-tools iproute2; do
    [[ $depends == *"$d"* ]] || fail "Depends lacks $d: $depends"
done

# The scratch root has no wireguard-tools in its database: dependencies are checked
# above, not by this dpkg.
# Minimal images exclude documentation from installs (dpkg path-exclude); the man
# page is part of what is checked, so it is included whatever the host says.
# The scratch root has no shell to run the maintainer scripts in: they run outside it,
# told the root (DPKG_ROOT), which they leave alone.
dpkg --root="$root" --log=/dev/null --force-depends --force-script-chrootless \
    --path-include='/usr/share/man/*' --path-include='/usr/share/doc/wirelane/*' -i "$deb"
files=$(dpkg --root="$root" -L wirelane)

version=$("$root/usr/bin/wirelane" --version)
[[ $version == "wirelane $(dpkg-deb -f "$deb" Version)" ]] || fail "--version says '$version'"
"$root/usr/bin/wirelane-lab" --version >/dev/null
man_text=$(MANPATH="$root/usr/share/man" MANWIDTH=80 man wirelane 2>&1)
[[ $man_text == *"--pool"* && $man_text == *"--metrics"* ]] || fail "man wirelane: $man_text"
MANPATH="$root/usr/share/man" man -w wirelane-lab >/dev/null
bash -n "$root/usr/share/bash-completion/completions/wirelane"
grep -q -- '--metrics' "$root/usr/share/bash-completion/completions/wirelane"
# The unit's Documentation= pages are in the scratch root, where man cannot see them.
systemd-analyze verify --man=no "$root/lib/systemd/system/wirelane@.service"
# The pool unit runs wirelane itself, which is installed in the scratch root only: it
# is checked as a copy that names that binary.
units=$(mktemp -d /tmp/wirelane-units.XXXXXX)
sed "s#/usr/bin/wirelane#$root/usr/bin/wirelane#" \
    "$root/lib/systemd/system/wirelane-pool@.service" >"$units/wirelane-pool@.service"
systemd-analyze verify --man=no "$units/wirelane-pool@.service"

for script in postinst prerm postrm; do
    sh -n "$root/var/lib/dpkg/info/wirelane.$script" || fail "$script does not parse"
done
zcat "$root/usr/share/doc/wirelane/changelog.gz" | grep -q "^wirelane (" || fail "changelog"

dpkg --root="$root" --log=/dev/null --force-script-chrootless -r wirelane
left=""
while IFS= read -r f; do
    [[ -f "$root$f" || -L "$root$f" ]] && left+=" $f"
done <<<"$files"
[[ -z $left ]] || fail "dpkg -r left:$left"
# And purged: its maintainer scripts run for purge too (outside this root they would
# forget the instances enabled at boot), and dpkg forgets the package.
dpkg --root="$root" --log=/dev/null --force-script-chrootless -P wirelane
if dpkg --root="$root" -s wirelane >/dev/null 2>&1; then
    fail "dpkg -P left the package known"
fi
echo "package test: installed, checked, removed and purged $(grep -c . <<<"$files") paths"
