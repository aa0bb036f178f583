#!/usr/bin/env bash
# Install what the test hosts (xce_lite/testhosts/) and the dashboard's browser tests need on Debian
# 12, as root. Idempotent: when everything is there it installs nothing and exits 0.
#
#   what the hosts use            Debian package
#   /lib/systemd/systemd          systemd          (PID 1 of each systemd test host)
#   /usr/sbin/sshd                openssh-server   (one sshd per host, started by hand inside it)
#   ssh-keygen                    openssh-client   (host and client keys)
#   unshare, nsenter, setpriv     util-linux
#   mount                         mount
#   /usr/bin/chromium             chromium         (headless, driven by Playwright in tests/e2e/test_web.py;
#                                                   Playwright's own browser download is never used)
#   /usr/sbin/slurmctld           slurmctld        (a one-node Slurm on loopback: tests/support/slurm.py)
#   /usr/sbin/slurmd              slurmd
#   sbatch, squeue, scancel, srun slurm-client
#   /usr/sbin/munged              munge            (Slurm's authentication, on a private socket and key)
#
# The system's own sshd is never started nor enabled by this script. The harness's hosts listen on
# 127.0.0.N:22 in the machine's one network namespace, so a system sshd on 0.0.0.0:22 would make every
# host's sshd fail to bind; and a test machine has no business accepting logins from outside. So the
# install runs with a policy-rc.d that forbids starting services, and a freshly installed ssh.service
# (or ssh.socket) is disabled and, if something started it anyway, stopped. The same holds for the
# Slurm and munge daemons: the test harness starts its own, on private sockets, and stops them by pid;
# the system's units are disabled so that a reboot does not start them either.
set -euo pipefail

if [[ $EUID != 0 ]]; then
  echo "install_test_deps.sh: needs root (apt-get install)" >&2
  exit 2
fi

missing=()
need() {  # need PATH-OR-COMMAND PACKAGE
  if [[ $1 == /* ]]; then [[ -x $1 ]] && return 0; else command -v "$1" >/dev/null && return 0; fi
  [[ " ${missing[*]-} " == *" $2 "* ]] || missing+=("$2")
}
need /lib/systemd/systemd systemd
need /usr/sbin/sshd openssh-server
need ssh-keygen openssh-client
need unshare util-linux
need nsenter util-linux
need setpriv util-linux
need mount mount
need /usr/bin/chromium chromium
need /usr/sbin/slurmctld slurmctld
need /usr/sbin/slurmd slurmd
need sbatch slurm-client
need /usr/sbin/munged munge
need strace strace

if [[ ${#missing[@]} == 0 ]]; then
  echo "install_test_deps.sh: nothing to install"
  exit 0
fi
echo "install_test_deps.sh: installing ${missing[*]}"

had_sshd=no
[[ -x /usr/sbin/sshd ]] && had_sshd=yes
had_slurm=no
[[ -x /usr/sbin/slurmctld && -x /usr/sbin/slurmd && -x /usr/sbin/munged ]] && had_slurm=yes

# Forbid service starts during the install, unless the machine already has a policy (then it is theirs).
policy=/usr/sbin/policy-rc.d
made_policy=no
if [[ ! -e $policy ]]; then
  printf '#!/bin/sh\n# written by xce_lite install_test_deps.sh for the length of one apt-get install\nexit 101\n' >"$policy"
  chmod 755 "$policy"
  made_policy=yes
fi
cleanup() { [[ $made_policy == yes ]] && rm -f "$policy"; return 0; }
trap cleanup EXIT

export DEBIAN_FRONTEND=noninteractive
apt-get update -qq
apt-get install -y -qq --no-install-recommends "${missing[@]}"

if [[ $had_sshd == no && -x /usr/sbin/sshd ]]; then
  # The package enables ssh.service for the next boot: undo that (see the top of this file).
  if command -v systemctl >/dev/null; then
    if [[ -d /run/systemd/system ]]; then
      systemctl disable --now ssh.service ssh.socket >/dev/null 2>&1 || true
    else
      systemctl disable ssh.service ssh.socket >/dev/null 2>&1 || true
    fi
  fi
  if command -v update-rc.d >/dev/null && [[ -e /etc/init.d/ssh ]]; then
    update-rc.d ssh disable >/dev/null 2>&1 || true
    # Without systemd the package may have started sshd through its init script: stop exactly that one.
    if [[ ! -d /run/systemd/system && -s /run/sshd.pid ]]; then
      pid=$(cat /run/sshd.pid)
      if [[ $(cat "/proc/$pid/comm" 2>/dev/null) == sshd ]]; then
        echo "install_test_deps.sh: stopping the system sshd the package started (pid $pid)"
        kill "$pid" || true
      fi
    fi
  fi
fi
if [[ $had_slurm == no ]] && command -v systemctl >/dev/null; then
  # Freshly installed: the packages enable their units for the next boot; the harness runs its own.
  systemctl disable slurmctld.service slurmd.service munge.service >/dev/null 2>&1 || true
fi
echo "install_test_deps.sh: done"
