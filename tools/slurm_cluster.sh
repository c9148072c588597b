#!/usr/bin/env bash
# A real Slurm cluster on this machine, for tests: munged, slurmctld and two
# slurmd daemons (nodes n1 and n2, each with this machine's cores), all from
# Debian's packages (slurmctld, slurmd, slurm-client, munge), configured and
# run as the calling user out of one folder.
#
#   tools/slurm_cluster.sh start DIR    # prints the SLURM_CONF line to export
#   tools/slurm_cluster.sh stop DIR
#
# Both nodes are this host (Debian builds Slurm with several slurmd per host
# allowed), so an Open MPI job across them must keep its ranks off shared
# memory between the two node names: the tests run such jobs with
# OMPI_MCA_btl=self,tcp. Job credentials live 10 s (cred_expire; Slurm's
# default is 120), which is also how long a requeued job waits before it
# starts again. Ranks start through Open MPI's Slurm support
# (mpirun inside the allocation), not srun's PMIx plugin, whose per-step
# folders collide when two nodes share one host.
set -euo pipefail
cmd=${1:-}
dir=${2:-}
if [ -z "$cmd" ] || [ -z "$dir" ]; then
  echo "usage: $0 start|stop DIR" >&2
  exit 2
fi
mkdir -p "$dir"
dir=$(cd "$dir" && pwd)

stop() {
  for f in "$dir"/run/*.pid; do
    [ -f "$f" ] || continue
    kill "$(cat "$f")" 2>/dev/null || true
  done
  [ -f "$dir/munge/munged.pid" ] && kill "$(cat "$dir/munge/munged.pid")" 2>/dev/null || true
  sleep 1
  rm -f "$dir"/run/*.pid "$dir/munge/munged.pid"
}

if [ "$cmd" = stop ]; then
  stop
  exit 0
fi
[ "$cmd" = start ] || { echo "$0: '$cmd' is not start or stop" >&2; exit 2; }

for b in munged slurmctld slurmd sbatch scontrol; do
  command -v "$b" >/dev/null || { echo "$0: $b is missing (tools/setup.sh installs Slurm and munge)" >&2; exit 2; }
done
stop
mkdir -p "$dir"/{state,log,run,munge,spool/n1,spool/n2}
chmod 700 "$dir/munge"
[ -f "$dir/munge/munge.key" ] || { dd if=/dev/urandom of="$dir/munge/munge.key" bs=1024 count=1 2>/dev/null; }
chmod 600 "$dir/munge/munge.key"
munged -f -S "$dir/munge/socket" --key-file="$dir/munge/munge.key" --log-file="$dir/log/munged.log" \
  --pid-file="$dir/munge/munged.pid" --seed-file="$dir/munge/seed"

# Five free TCP ports: the controller's, slurmd's default and the two nodes'.
read -r p_ctl p_d p_n1 p_n2 <<<"$(python3 - <<'EOF'
import socket
socks = []
for _ in range(4):
    s = socket.socket(); s.bind(("127.0.0.1", 0)); socks.append(s)
print(" ".join(str(s.getsockname()[1]) for s in socks))
EOF
)"
host=$(hostname)
cores=$(nproc)
user=$(id -un)
mem=$(( $(awk '/MemTotal/ {print $2}' /proc/meminfo) / 1024 / 4 ))
cat > "$dir/slurm.conf" <<EOF
ClusterName=weft-test
SlurmctldHost=$host(127.0.0.1)
SlurmctldPort=$p_ctl
SlurmdPort=$p_d
AuthType=auth/munge
CredType=cred/munge
AuthInfo=socket=$dir/munge/socket,cred_expire=10
SlurmUser=$user
SlurmdUser=$user
StateSaveLocation=$dir/state
SlurmdSpoolDir=$dir/spool/%n
SlurmctldPidFile=$dir/run/slurmctld.pid
SlurmdPidFile=$dir/run/slurmd-%n.pid
SlurmctldLogFile=$dir/log/slurmctld.log
SlurmdLogFile=$dir/log/slurmd-%n.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
MpiDefault=none
ReturnToService=2
JobRequeue=1
SchedulerType=sched/builtin
NodeName=n1 NodeHostname=$host NodeAddr=127.0.0.1 Port=$p_n1 CPUs=$cores RealMemory=$mem State=UNKNOWN
NodeName=n2 NodeHostname=$host NodeAddr=127.0.0.1 Port=$p_n2 CPUs=$cores RealMemory=$mem State=UNKNOWN
PartitionName=test Nodes=n1,n2 Default=YES MaxTime=INFINITE State=UP OverSubscribe=FORCE:4
EOF
export SLURM_CONF="$dir/slurm.conf"
slurmctld -f "$SLURM_CONF"
slurmd -f "$SLURM_CONF" -N n1
slurmd -f "$SLURM_CONF" -N n2
for _ in $(seq 60); do
  if [ "$(sinfo -h -o %T 2>/dev/null | grep -c idle)" -ge 1 ] && [ "$(sinfo -h -N -o %T 2>/dev/null | grep -c idle)" -eq 2 ]; then
    echo "export SLURM_CONF=$SLURM_CONF"
    exit 0
  fi
  sleep 0.5
done
echo "$0: the nodes did not come up; logs in $dir/log" >&2
sinfo -N >&2 || true
exit 1
