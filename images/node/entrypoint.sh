#!/bin/sh
# tflab node entrypoint: inject the lab's SSH keys, make fresh host keys, run sshd.
# Keys arrive read-only at /etc/tflab/keys when the node starts; none is in the image.
set -eu

mkdir -p /root/.ssh /run/sshd /workspace /data /runs
chmod 700 /root/.ssh
if [ -f /etc/tflab/keys/id_ed25519.pub ]; then
    cp /etc/tflab/keys/id_ed25519.pub /root/.ssh/authorized_keys
    cp /etc/tflab/keys/id_ed25519.pub /root/.ssh/id_ed25519.pub
    chmod 600 /root/.ssh/authorized_keys
fi
if [ -f /etc/tflab/keys/id_ed25519 ]; then
    # The lab key lets a node reach its peers by name (what MPI-style launchers expect).
    cp /etc/tflab/keys/id_ed25519 /root/.ssh/id_ed25519
    chmod 600 /root/.ssh/id_ed25519
fi
cat > /root/.ssh/config <<'CONF'
Host *
    StrictHostKeyChecking no
    UserKnownHostsFile /dev/null
    LogLevel ERROR
CONF
chmod 600 /root/.ssh/config

# A lab made with --link-rate/--link-delay shapes its traffic before anything else runs.
/usr/local/share/tflab/shape.sh || { echo "tflab: link shaping failed; the node stops rather than run unshaped" >&2; exit 1; }

# Every node's host keys are its own, made at first start.
ssh-keygen -A >/dev/null

# SSH sessions see what `docker exec` sees: TF_CONFIG, TFLAB_*, PATH and the CUDA variables.
env | grep -E '^(TF_CONFIG|TFLAB_[A-Z_]*|TF_CPP_MIN_LOG_LEVEL|PATH|LD_LIBRARY_PATH|NVIDIA_[A-Z_]*|CUDA_[A-Z_]*|PYTHONUNBUFFERED|LANG)=' \
    > /root/.ssh/environment || true
sed 's/^\([^=]*\)=\(.*\)$/export \1='"'"'\2'"'"'/' /root/.ssh/environment > /etc/profile.d/tflab.sh

exec /usr/sbin/sshd -D -e
