#!/bin/sh
# tflab node entrypoint: inject the lab's SSH keys, make fresh host keys, run sshd.
# Keys arrive read-only when the node starts (a bind mount at /etc/tflab/keys, or swarm
# secrets in /run/secrets); none is in the image.
set -eu

mkdir -p /root/.ssh /run/sshd /workspace /data /runs
chmod 700 /root/.ssh
public=/etc/tflab/keys/id_ed25519.pub
private=/etc/tflab/keys/id_ed25519
[ -f "$public" ] || public=/run/secrets/tflab_id_ed25519.pub
[ -f "$private" ] || private=/run/secrets/tflab_id_ed25519
if [ -f "$public" ]; then
    cp "$public" /root/.ssh/authorized_keys
    cp "$public" /root/.ssh/id_ed25519.pub
    chmod 600 /root/.ssh/authorized_keys
fi
if [ -f "$private" ]; then
    # The lab key lets a node reach its peers by name (what MPI-style launchers expect).
    cp "$private" /root/.ssh/id_ed25519
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

# Every node's host key is its own, made at first start (ed25519 only: made in milliseconds,
# where RSA keys would hold up every `up`).
[ -f /etc/ssh/ssh_host_ed25519_key ] || ssh-keygen -q -t ed25519 -N '' -f /etc/ssh/ssh_host_ed25519_key

# SSH sessions see what `docker exec` sees: TF_CONFIG, TFLAB_*, PATH, the CUDA variables, Keras 2's switch, proxies.
env | grep -E '^(TF_CONFIG|TFLAB_[A-Z_]*|TF_CPP_MIN_LOG_LEVEL|TF_NUM_(INTRA|INTER)OP_THREADS|TF_USE_LEGACY_KERAS|OMP_NUM_THREADS|PATH|LD_LIBRARY_PATH|NVIDIA_[A-Z_]*|CUDA_[A-Z_]*|PYTHONUNBUFFERED|LANG|(HTTPS?|FTP|ALL|NO)_PROXY|(https?|ftp|all|no|grpc)_proxy)=' \
    > /root/.ssh/environment || true
sed 's/^\([^=]*\)=\(.*\)$/export \1='"'"'\2'"'"'/' /root/.ssh/environment > /etc/profile.d/tflab.sh

exec /usr/sbin/sshd -D -e
