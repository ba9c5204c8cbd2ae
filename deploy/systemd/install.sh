#!/bin/sh
# install.sh installs lchat-caddy on one box from a checkout: the binary and lchat-pageread
# (built beside it: CGO_ENABLED=0 go build -o <dir>/lchat-pageread ./cmd/lchat-pageread), the demo
# space's own binary when it sits beside it, the Caddyfile with the snippet files it
# imports, and the systemd unit.
#
#   deploy/systemd/install.sh <lchat-caddy binary> [single|mesh]
#
# Installed paths (imports are relative to the Caddyfile, so the snippets must sit
# beside it):
#
#   /usr/local/bin/lchat-caddy
#   /usr/local/bin/lchat-pageread              reads an isolated space's SQLite databases
#                                              for its checkpoints, under the space's uid
#                                              (docs/parsers.md); found beside lchat-caddy
#   /usr/local/bin/lchat-demo-space            from beside the given binary (CGO_ENABLED=0
#                                              go build -o bin/lchat-demo-space ./cmd/lchat-demo-space);
#                                              without it the demo kind runs the slower
#                                              `lchat-caddy demo-space` alias
#   /etc/lchat-caddy/Caddyfile                 caddyfiles/single.Caddyfile (or mesh.Caddyfile)
#   /etc/lchat-caddy/dns-dnsimple.caddy        LCHAT_DNS_PROVIDER=dnsimple (default)
#   /etc/lchat-caddy/dns-route53.caddy         LCHAT_DNS_PROVIDER=route53
#   /etc/lchat-caddy/cert-cache-local.caddy    LCHAT_CERT_CACHE=local (default)
#   /etc/lchat-caddy/cert-cache-s3.caddy       LCHAT_CERT_CACHE=s3
#   /etc/lchat-caddy/relocate-dns-*.caddy      mesh.Caddyfile: relocate --move-dns, by LCHAT_DNS_PROVIDER
#   /etc/systemd/system/lchat-caddy.service
#
# The settings and credentials go in /data/router.env (mode 0600, owned by root); this
# script never writes or reads it. With DESTDIR set, files go under it and the user and
# systemd steps are skipped (for packaging, or to look before installing).
set -eu

if [ $# -lt 1 ] || [ $# -gt 2 ]; then
	echo "usage: $0 <lchat-caddy binary> [single|mesh]" >&2
	exit 2
fi
bin=$1
flavor=${2:-single}
repo=$(cd "$(dirname "$0")/../.." && pwd)
dest=${DESTDIR:-}

case $flavor in
single | mesh) ;;
*)
	echo "$0: unknown flavor $flavor: single or mesh" >&2
	exit 2
	;;
esac
[ -x "$bin" ] || {
	echo "$0: $bin is not an executable" >&2
	exit 1
}
pageread=$(dirname "$bin")/lchat-pageread
[ -x "$pageread" ] || {
	echo "$0: $pageread is missing: build it beside lchat-caddy (CGO_ENABLED=0 go build -o $pageread ./cmd/lchat-pageread)" >&2
	exit 1
}

install -D -m 0755 "$bin" "$dest/usr/local/bin/lchat-caddy"
install -D -m 0755 "$pageread" "$dest/usr/local/bin/lchat-pageread"
demo=$(dirname "$bin")/lchat-demo-space
if [ -x "$demo" ]; then
	install -m 0755 "$demo" "$dest/usr/local/bin/lchat-demo-space"
else
	echo "$0: no $demo: the demo kind will run the lchat-caddy demo-space alias (a slower wake)" >&2
fi
install -d -m 0755 "$dest/etc/lchat-caddy"
install -m 0644 "$repo/caddyfiles/$flavor.Caddyfile" "$dest/etc/lchat-caddy/Caddyfile"
for f in "$repo"/caddyfiles/dns-*.caddy "$repo"/caddyfiles/relocate-dns-*.caddy "$repo"/caddyfiles/cert-cache-*.caddy; do
	install -m 0644 "$f" "$dest/etc/lchat-caddy/"
done
install -D -m 0644 "$repo/deploy/systemd/lchat-caddy.service" "$dest/etc/systemd/system/lchat-caddy.service"

if [ -n "$dest" ]; then
	exit 0
fi
if ! id lchat >/dev/null 2>&1; then
	useradd --system --home-dir /var/lib/lchat-caddy --no-create-home --shell /usr/sbin/nologin lchat
fi
systemctl daemon-reload
if [ ! -e /data/router.env ]; then
	echo "next: write /data/router.env (mode 0600), then systemctl enable --now lchat-caddy" >&2
else
	echo "next: systemctl enable --now lchat-caddy (or systemctl restart lchat-caddy)" >&2
fi
