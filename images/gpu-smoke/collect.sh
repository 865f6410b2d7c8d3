#!/bin/sh
# Copy into $1 the files the GPU smoke job needs from this (Debian bookworm) image: python3
# with its standard library (no tests, caches, IDLE, Tk, 2to3, pydoc data), /bin/sh (dash),
# every shared library they load (from ldd), the C libraries nvidia-smi and libcuda load
# (libpthread, libdl, librt, libm, libgcc_s), the /job layout and user 10001.
set -eu
R=$1
PY=/usr/bin/python3.11
mkdir -p "$R"
# Merged /usr: /bin, /lib, /lib64 and /sbin are links into /usr, as in Debian.
for d in bin lib lib64 sbin; do cp -a "/$d" "$R/"; done

lib() {  # copy a shared library under its own name (links followed), with its folder
    real="$(readlink -f "$(dirname "$1")")/$(basename "$1")"
    [ -e "$R$real" ] || cp -L --parents "$real" "$R"
}
deps() {  # the libraries ldd says $1 loads
    ldd "$1" 2>/dev/null | awk '/=> \//{print $3} /^\t\/lib/{print $1}' | while read -r so; do
        lib "$so"
    done
}

cp --parents "$PY" /usr/bin/dash "$R"
ln -s python3.11 "$R/usr/bin/python3"
ln -s dash "$R/usr/bin/sh"
deps "$PY"
deps /usr/bin/dash
for so in /usr/lib/python3.11/lib-dynload/*.so; do deps "$so"; done
for so in libpthread.so.0 libdl.so.2 librt.so.1 libm.so.6 libgcc_s.so.1 libresolv.so.2; do
    lib "/lib/x86_64-linux-gnu/$so"
done

tar -C / -cf - \
    --exclude='__pycache__' --exclude='python3.11/test' --exclude='*/tests' \
    --exclude='python3.11/idlelib' --exclude='python3.11/tkinter' \
    --exclude='python3.11/turtledemo' --exclude='python3.11/lib2to3' \
    --exclude='python3.11/pydoc_data' --exclude='python3.11/ensurepip' \
    --exclude='python3.11/config-3.11-*' \
    usr/lib/python3.11 | tar -C "$R" -xf -

mkdir -p "$R/etc" "$R/tmp" "$R/dev" "$R/proc" "$R/sys" "$R/usr/local/bin" "$R/opt/gpu-smoke"
chmod 1777 "$R/tmp"
printf 'root:x:0:0:root:/root:/bin/sh\njob:x:10001:10001::/job/workspace:/bin/sh\n' >"$R/etc/passwd"
printf 'root:x:0:\njob:x:10001:\n' >"$R/etc/group"
mkdir -p "$R/job/input" "$R/job/output" "$R/job/workspace" "$R/job/execution"
chown 10001:10001 "$R/job/output" "$R/job/workspace"
chmod 0755 "$R/job" "$R/job/input" "$R/job/execution"
chmod 0775 "$R/job/output" "$R/job/workspace"
# The job's image works: Python starts with ctypes and json from the copied tree.
chroot "$R" /usr/bin/python3 -c 'import ctypes, json, subprocess, argparse' 
