#!/bin/sh
# mkimage.sh builds the Debian 12 disk image the deployment test boots, into <dir>:
#
#   tests/deploy/mkimage.sh <dir>      (as root; needs mmdebstrap and e2fsprogs)
#
# <dir>/disk.img (ext4, the root filesystem), <dir>/vmlinuz and <dir>/initrd.img. The
# test caches <dir> under a name keyed by this file's content: change the package list
# or the hooks here and the next run builds a new image.
#
# The image holds only Debian: systemd, udev, the kernel, iproute2, curl, nftables,
# passwd (useradd, which install.sh runs). Everything the test brings (lchat-caddy,
# versitygw, pebble, the agent) comes on a second disk, mounted read-only at
# /srv/payload, whose agent the image starts at boot (lchat-test-agent.service).
# Networking is QEMU's user network: 10.0.2.15/24, and nothing beyond it (the test
# starts QEMU with restrict=on).
set -eu
dir=$1
packages=systemd,systemd-sysv,udev,linux-image-amd64,iproute2,ca-certificates,curl,kmod,passwd,procps,nftables
sources=/etc/apt/sources.list.d/debian.sources
[ -e "$sources" ] || sources=/etc/apt/sources.list
rm -rf "$dir.tmp"
mkdir -p "$dir.tmp"
root=$dir.tmp/rootfs
mmdebstrap --variant=apt --include="$packages" \
	--customize-hook='echo lchat-box >"$1/etc/hostname"' \
	--customize-hook='printf "/dev/vda / ext4 defaults 0 1\n/dev/vdb /srv/payload ext4 ro,nofail 0 0\n" >"$1/etc/fstab"' \
	--customize-hook='mkdir -p "$1/srv/payload"' \
	--customize-hook='printf "[Match]\nName=en*\n\n[Network]\nAddress=10.0.2.15/24\nGateway=10.0.2.2\n" >"$1/etc/systemd/network/10-user.network"' \
	--customize-hook='chroot "$1" systemctl enable systemd-networkd.service' \
	--customize-hook='printf "[Unit]\nDescription=deployment test agent\nRequiresMountsFor=/srv/payload\nAfter=network.target\n\n[Service]\nExecStart=/srv/payload/vmagent serve\nRestart=always\n\n[Install]\nWantedBy=multi-user.target\n" >"$1/etc/systemd/system/lchat-test-agent.service"' \
	--customize-hook='chroot "$1" systemctl enable lchat-test-agent.service' \
	--customize-hook='chroot "$1" systemctl mask getty@tty1.service serial-getty@ttyS0.service apt-daily.timer apt-daily-upgrade.timer e2scrub_all.timer fstrim.timer' \
	bookworm "$root" "$sources"
cp "$root"/boot/vmlinuz-* "$dir.tmp/vmlinuz"
cp "$root"/boot/initrd.img-* "$dir.tmp/initrd.img"
truncate -s 3G "$dir.tmp/disk.img"
mke2fs -q -t ext4 -d "$root" "$dir.tmp/disk.img"
rm -rf "$root"
rm -rf "$dir"
mv "$dir.tmp" "$dir"
