#!/bin/bash -e
# pi-gen: runs on the build host with ROOTFS_DIR set; files/ is filled by images/pi-gen/prepare.sh.
cd "$(dirname "$0")"
[ -x files/eie/eie ] || { echo "run images/pi-gen/prepare.sh first" >&2; exit 1; }
install -d "${ROOTFS_DIR}/opt/eie" "${ROOTFS_DIR}/etc/eie" "${ROOTFS_DIR}/usr/lib/sysusers.d"
cp -a files/eie/. "${ROOTFS_DIR}/opt/eie/"
cp -a files/models "${ROOTFS_DIR}/opt/eie/models"
install -m 0644 files/eie.service "${ROOTFS_DIR}/etc/systemd/system/eie.service"
install -m 0644 files/eie.sysusers.conf "${ROOTFS_DIR}/usr/lib/sysusers.d/eie.conf"
install -m 0644 files/eie.yaml "${ROOTFS_DIR}/etc/eie/eie.yaml"
install -m 0644 files/eie.env "${ROOTFS_DIR}/etc/eie/eie.env"
on_chroot <<EOC
systemd-sysusers /usr/lib/sysusers.d/eie.conf
systemctl enable eie.service
EOC
