//! ckpt on a real verbs job: tests/c/ib/rc_pingpong.c (two processes, RC
//! send/receive over rxe0, every message checked by both sides) in the
//! SoftRoCE VM of scripts/ib-vm.sh.
//!
//! - Without the verbs layer, `ckpt dump` refuses the job by name and the
//!   job finishes its stream untouched.
//! - Started with `ckpt run --ib`, the job is dumped with `--kill` in the
//!   middle of its stream, rxe0 is replaced by a device of another name on
//!   the same link, the job is restored onto it, and finishes: both sides report
//!   the same stream checksum as a run that was never interrupted, and
//!   the dump reports the layer's drain. (The device gives the recreated
//!   QPs new numbers; ib-state/shadow/tests/rxe.rs shows the program never
//!   sees them.)
//!
//! - Two "nodes" of one job (the two sides run as separate process trees
//!   that swapped their endpoints over TCP and then talk only over verbs),
//!   each dumped by its own `ckpt dump --coord` agent and restarted by its
//!   own `ckpt restore --coord --peers`: the verbs layers' restart blobs go
//!   through the coordinator's publish phase, and the stream completes with
//!   the uninterrupted checksum on both sides.
//!
//! - rdma-core's own `ibv_rc_pingpong` (Debian's ibverbs-utils, a program
//!   nobody here wrote), server and client as two such nodes, once busy
//!   polling and once waiting on completion events (`-e`, its threads
//!   blocked in `ibv_get_cq_event` when frozen): dumped mid-run, restored,
//!   and both finish every iteration.
//!
//! - tests/c/ib/rc_restart.c and ud_srq_restart.c with their restarts done
//!   by ckpt (`--pause`: at each restart point the program waits, and is
//!   dumped with `--kill` and restored): RDMA write with immediate and RDMA
//!   read, unsignaled sends before a signaled one, sends waiting on RNR,
//!   a completion whose event was pending, a thread whose read of an
//!   event had returned (its CQ still destroyed after every event read is
//!   acked), UD through an address handle
//!   and an SRQ shared by two QPs, each message exactly once. And a dump
//!   while a thread holds the C library's malloc lock (inside
//!   `malloc_stats`, writing to a full pipe): refused by name, the program
//!   goes on untouched and its later points dump and restore.
//! - tests/c/ib/rc_atomic_restart.c (fetch-and-adds on a peer QP's
//!   counter, applied by the responder, whose completions the layer's test
//!   hook holds back from the drain) dumped and restored at two points,
//!   signaled and unsignaled: the counter is exactly what was added, no
//!   fetch-and-add executed again; held back past the drain's limit, the
//!   dumps are refused by name and the program finishes untouched.
//! - Two guests as two nodes (`scripts/ib-vm.sh run --link`: rxe over a
//!   virtual link between them, RoCE between two kernels): the ping-pong's
//!   server in guest 1 with the coordinator, its client in guest 2; both
//!   dumped by their `ckpt dump --coord` agents mid-stream, killed, and
//!   restarted by `ckpt restore --coord --peers`: the stream completes with
//!   the checksum of an uninterrupted run over the same link.
//!
//! A missing harness prerequisite fails the test with the harness's
//! message; it never skips.

use std::fs;
use std::os::unix::fs::PermissionsExt;
use std::path::Path;
use std::process::Command;

use crate::common::*;

/// Boot, a reference run, a refused dump, and the dumped and restored run
/// under TCG. The lab tier boots several guests at once on two cores: a
/// guest whose programs had all ended was once still shutting down at
/// 240 s.
const VM_TIMEOUT_SECS: u32 = 420;
/// Round trips per run: about 8 s of ping-pong under TCG.
const MESSAGES: u32 = 600;
/// Round trips of the job dumped alone in one guest: 2 to 20 s of
/// ping-pong under TCG depending on the host's load, so a dump 1 s after
/// both sides connected lands in the middle.
const LONG_MESSAGES: u32 = 1500;
/// Two guests at once under TCG, each booting, a reference run, the
/// dumped run and its restore.
const LINKED_TIMEOUT_SECS: u32 = 300;

const GUEST_SCRIPT: &str = r#"#!/bin/sh
S=$CKPT_IB_SCRATCH
cd "$S"
export CKPT_IMAGE_KEY=$S/key
(umask 077; head -c 32 /dev/urandom >"$CKPT_IMAGE_KEY")
./rc_pingpong rxe0 LONG_MESSAGES >ref.out 2>&1; echo "reference exit $?"

# Both sides connected (each prints its qp_num), then a moment into the
# stream: a loaded host can take seconds to get there under TCG, a quiet
# one runs the whole stream in a few.
connected() {
    i=0; while [ "$(grep -c qp_num $1 2>/dev/null)" -lt 2 ] && [ $i -lt 600 ]; do sleep 0.1; i=$((i+1)); done
    sleep 1
}
./rc_pingpong rxe0 LONG_MESSAGES >plain.out 2>&1 </dev/null &
P=$!
connected plain.out
./ckpt dump --tree $P --dir plain-img >refused.out 2>&1; echo "plain dump exit $?"
wait $P; echo "plain job exit $?"

# Launched by a shell, as a batch script would: the shell has the layer
# and no verbs object (nor libibverbs).
CKPT_IB_LAYER=$S/libckpt_ibverbs.so ./ckpt run --ib -- sh -c './rc_pingpong rxe0 LONG_MESSAGES; echo "launcher: job exit $?"' >job.out 2>&1 </dev/null &
P=$!
connected job.out
./ckpt -v dump --tree $P --dir img --kill >dump.out 2>&1; echo "dump exit $?"
wait $P
./ckpt show img >show.out 2>&1
# The job comes back on another device: rxe0 is gone, rxe_moved (same
# link, so same GID) is the one there is.
rdma link delete rxe0 && rdma link add rxe_moved type rxe netdev veth0; echo "device moved exit $?"
./ckpt -v restore --dir img >restore.out 2>&1; echo "restore exit $?"
rdma link show >links.out 2>&1
"#;

const TWO_NODES_SCRIPT: &str = r#"#!/bin/sh
S=$CKPT_IB_SCRATCH
cd "$S"
export CKPT_IMAGE_KEY=$S/key
(umask 077; head -c 32 /dev/urandom >"$CKPT_IMAGE_KEY")
export CKPT_IB_LAYER=$S/libckpt_ibverbs.so
./ckpt coord --listen 127.0.0.1:7420 --job J --expect 2 --state-dir "$S/coord" >coord.out 2>&1 &
C=$!
i=0; while [ ! -e "$S/coord/J.secret" ] && [ $i -lt 100 ]; do sleep 0.1; i=$((i+1)); done
export CKPT_COORD_SECRET=$(cat "$S/coord/J.secret")
./rc_pingpong rxe0 MESSAGES --server 7500 >ref-s.out 2>&1 &
RS=$!
./rc_pingpong rxe0 MESSAGES --client 7500 >ref-c.out 2>&1
wait $RS
echo "reference done"
./ckpt run --ib -- ./rc_pingpong rxe0 MESSAGES --server 7501 >job-s.out 2>&1 </dev/null &
PS=$!
./ckpt run --ib -- ./rc_pingpong rxe0 MESSAGES --client 7501 >job-c.out 2>&1 </dev/null &
PC=$!
# Both connected (each prints its qp_num), then a moment into the stream.
i=0; while [ "$(cat job-s.out job-c.out 2>/dev/null | grep -c qp_num)" -lt 2 ] && [ $i -lt 600 ]; do sleep 0.1; i=$((i+1)); done
sleep 1
./ckpt -v dump --tree $PS --dir n1 --coord 127.0.0.1:7420 --job J --node n1 --kill >dump1.out 2>&1 &
D1=$!
./ckpt -v dump --tree $PC --dir n2 --coord 127.0.0.1:7420 --job J --node n2 --kill >dump2.out 2>&1; echo "dump2 exit $?"
wait $D1; echo "dump1 exit $?"
wait $PS $PC
./ckpt -v restore --dir n1 --coord 127.0.0.1:7420 --job J --node n1 --peers n1,n2 >restore1.out 2>&1 &
R1=$!
./ckpt -v restore --dir n2 --coord 127.0.0.1:7420 --job J --node n2 --peers n1,n2 >restore2.out 2>&1; echo "restore2 exit $?"
wait $R1; echo "restore1 exit $?"
kill $C
"#;

/// Two ranks launched by Open MPI's `mpirun` (not MPI programs: each
/// is one side of the ping-pong, by its rank), the whole launch under
/// `ckpt run --ib`: mpirun, its ranks' shells and the ranks all have the
/// layer, only the ranks a verbs object. Dumped mid-stream, restored.
const MPIRUN_SCRIPT: &str = r#"#!/bin/sh
S=$CKPT_IB_SCRATCH
cd "$S"
export CKPT_IMAGE_KEY=$S/key
(umask 077; head -c 32 /dev/urandom >"$CKPT_IMAGE_KEY")
export CKPT_IB_LAYER=$S/libckpt_ibverbs.so
# The guest boots without a host name, which Open MPI refuses ("(none)").
hostname ibguest
cat >rank.sh <<'RANK'
#!/bin/sh
if [ "$OMPI_COMM_WORLD_RANK" = 0 ]; then
    ./rc_pingpong rxe0 LONG_MESSAGES --server 7600 >rank0.out 2>&1
else
    ./rc_pingpong rxe0 LONG_MESSAGES --client 7600 >rank1.out 2>&1
fi
echo "rank $OMPI_COMM_WORLD_RANK exit $?"
RANK
chmod +x rank.sh
MPIRUN="mpirun --allow-run-as-root --oversubscribe -np 2 --mca btl self,tcp --mca plm isolated"
$MPIRUN ./rank.sh >ref-mpirun.out 2>&1 </dev/null; echo "reference exit $?"
mv rank0.out ref-rank0.out; mv rank1.out ref-rank1.out
./ckpt run --ib -- $MPIRUN ./rank.sh >mpirun.out 2>&1 </dev/null &
P=$!
i=0; while [ "$(cat rank0.out rank1.out 2>/dev/null | grep -c qp_num)" -lt 2 ] && [ $i -lt 600 ]; do sleep 0.1; i=$((i+1)); done
sleep 1
./ckpt -v dump --tree $P --dir img --kill >dump.out 2>&1; echo "dump exit $?"
wait $P
./ckpt -v restore --dir img >restore.out 2>&1; echo "restore exit $?"
"#;

/// ibv_rc_pingpong as two nodes: `round TAG PORT ITERS [-e]` runs a
/// coordinator on PORT, the server and client under `ckpt run --ib`,
/// dumps both mid-run, restores both, and leaves TAG-*.out behind.
const RDMA_CORE_SCRIPT: &str = r#"#!/bin/sh
S=$CKPT_IB_SCRATCH
cd "$S"
export CKPT_IMAGE_KEY=$S/key
(umask 077; head -c 32 /dev/urandom >"$CKPT_IMAGE_KEY")
export CKPT_IB_LAYER=$S/libckpt_ibverbs.so
round() {
    T=$1; PORT=$2; ITERS=$3; shift 3
    # A coordinator takes its secret from the environment when set.
    unset CKPT_COORD_SECRET
    ./ckpt coord --listen 127.0.0.1:$PORT --job $T --expect 2 --state-dir "$S/coord-$T" >$T-coord.out 2>&1 &
    C=$!
    i=0; while [ ! -e "$S/coord-$T/$T.secret" ] && [ $i -lt 100 ]; do sleep 0.1; i=$((i+1)); done
    export CKPT_COORD_SECRET=$(cat "$S/coord-$T/$T.secret")
    ./ckpt run --ib -- ibv_rc_pingpong -d rxe0 -g 1 -n $ITERS "$@" >$T-s.out 2>&1 </dev/null &
    PS=$!
    # The client connects once: wait until the server listens on its
    # port (18515, 0x4853; state 0A), however slow the emulated CPU.
    i=0; while ! grep -qE ':4853 [0-9A-F]+:0000 0A' /proc/net/tcp /proc/net/tcp6 2>/dev/null && [ $i -lt 300 ]; do sleep 0.1; i=$((i+1)); done
    ./ckpt run --ib -- ibv_rc_pingpong -d rxe0 -g 1 -n $ITERS "$@" 127.0.0.1 >$T-c.out 2>&1 </dev/null &
    PC=$!
    sleep 3
    ./ckpt -v dump --tree $PS --dir $T-n1 --coord 127.0.0.1:$PORT --job $T --node n1 --kill >$T-dump1.out 2>&1 &
    D1=$!
    ./ckpt -v dump --tree $PC --dir $T-n2 --coord 127.0.0.1:$PORT --job $T --node n2 --kill >$T-dump2.out 2>&1
    echo "$T dump2 exit $?"
    wait $D1; echo "$T dump1 exit $?"
    wait $PS $PC
    ./ckpt -v restore --dir $T-n1 --coord 127.0.0.1:$PORT --job $T --node n1 --peers n1,n2 >$T-restore1.out 2>&1 &
    R1=$!
    ./ckpt -v restore --dir $T-n2 --coord 127.0.0.1:$PORT --job $T --node n2 --peers n1,n2 >$T-restore2.out 2>&1
    echo "$T restore2 exit $?"
    wait $R1; echo "$T restore1 exit $?"
    kill $C
}
# Busy polling starves the emulated CPU (about 12 ms an iteration); waiting
# on events does not (under 1 ms): as many iterations as make a run last
# past the dump either way.
round poll 7421 1500
round event 7422 15000 -e
"#;

/// Guest N of the two-guest job (NODE and SIDE filled in): guest 1 runs
/// the coordinator and the server, guest 2 the client, each under its own
/// agent; the shared scratch carries the coordinator's secret and the
/// outputs.
const LINKED_SCRIPT: &str = r#"#!/bin/sh
S=$CKPT_IB_SCRATCH
cd "$S"
export CKPT_IMAGE_KEY=$S/key CKPT_IB_LAYER=$S/libckpt_ibverbs.so
HEAD=10.214.0.1
if [ NODE = 1 ]; then
    ./ckpt coord --listen $HEAD:7420 --job J --expect 2 --state-dir "$S/coord" >coord.out 2>&1 &
    C=$!
    ARGS="--server"
else
    ARGS="--client"
fi
i=0; while [ ! -s "$S/coord/J.secret" ] && [ $i -lt 600 ]; do sleep 0.1; i=$((i+1)); done
export CKPT_COORD_SECRET=$(cat "$S/coord/J.secret")
PEER=; [ NODE = 2 ] && PEER=$HEAD
./rc_pingpong rxe0 MESSAGES $ARGS 7500 $PEER >ref-SIDE.out 2>&1; echo "reference exit $?"
./ckpt run --ib -- ./rc_pingpong rxe0 MESSAGES $ARGS 7501 $PEER >job-SIDE.out 2>&1 </dev/null &
P=$!
i=0; while ! grep -q qp_num job-SIDE.out 2>/dev/null && [ $i -lt 600 ]; do sleep 0.1; i=$((i+1)); done
sleep 2
./ckpt -v dump --tree $P --dir nNODE --coord $HEAD:7420 --job J --node nNODE --kill >dumpNODE.out 2>&1
echo "dump exit $?"
wait $P
./ckpt -v restore --dir nNODE --coord $HEAD:7420 --job J --node nNODE --peers n1,n2 >restoreNODE.out 2>&1
echo "restore exit $?"
[ NODE = 1 ] && kill $C
exit 0
"#;

/// The restart programs with ckpt doing their restarts: `external PROG
/// ROUNDS POINT...` dumps (`--kill`) and restores PROG at each of its
/// restart points.
const EXTERNAL_SCRIPT: &str = r#"#!/bin/sh
S=$CKPT_IB_SCRATCH
cd "$S"
export CKPT_IMAGE_KEY=$S/key CKPT_IB_LAYER=$S/libckpt_ibverbs.so
(umask 077; head -c 32 /dev/urandom >"$CKPT_IMAGE_KEY")
external() {
    prog=$1; rounds=$2; shift 2
    D=$S/pause-$prog; mkdir -p $D
    ./ckpt run --ib -- ./$prog rxe0 $rounds --pause $D >$prog.out 2>&1 </dev/null &
    W=$!
    P=$W
    for n in "$@"; do
        i=0; while [ ! -e $D/ready-$n ] && [ $i -lt 600 ]; do sleep 0.1; i=$((i+1)); done
        ./ckpt -v dump --tree $P --dir img-$prog-$n --kill >>$prog-ckpt.out 2>&1 || { echo "$prog dump $n failed"; return; }
        wait $W
        ./ckpt -v restore --dir img-$prog-$n >>$prog-ckpt.out 2>&1 </dev/null &
        W=$!
        i=0; while [ "$(grep -c 'restored pid' $prog-ckpt.out)" -lt "$(ls -d img-$prog-* | wc -l)" ] && [ $i -lt 600 ]; do sleep 0.1; i=$((i+1)); done
        touch $D/go-$n
    done
    wait $W; echo "$prog exit $?"
}
external rc_restart 2 0 1 99 100
external ud_srq_restart 2 0 1
# A thread holds malloc's lock at point 98: the dump is refused and the
# program goes on; its next points are dumped and restored as above.
D=$S/pause-held; mkdir -p $D
./ckpt run --ib -- ./rc_restart rxe0 1 --pause $D --hold-malloc >held.out 2>&1 </dev/null &
W=$!; P=$W
i=0; while [ ! -e $D/ready-98 ] && [ $i -lt 600 ]; do sleep 0.1; i=$((i+1)); done
./ckpt -v dump --tree $P --dir img-held-98 --kill >held-refused.out 2>&1; echo "held dump exit $?"
[ -e img-held-98 ] && echo "held dump left a directory"
touch $D/go-98
for n in 0 99; do
    i=0; while [ ! -e $D/ready-$n ] && [ $i -lt 600 ]; do sleep 0.1; i=$((i+1)); done
    ./ckpt -v dump --tree $P --dir img-held-$n --kill >>held-ckpt.out 2>&1 || echo "held dump $n failed"
    wait $W
    ./ckpt -v restore --dir img-held-$n >>held-ckpt.out 2>&1 </dev/null &
    W=$!
    i=0; while [ "$(grep -c 'restored pid' held-ckpt.out)" -lt "$(ls -d img-held-* | wc -l)" ] && [ $i -lt 600 ]; do sleep 0.1; i=$((i+1)); done
    touch $D/go-$n
done
wait $W; echo "held exit $?"
"#;

/// tests/c/ib/rc_atomic_restart.c restarted by ckpt at its two points:
/// fetch-and-adds (signaled, then unsignaled with an RDMA write behind
/// them) the responder executed and whose completions the drain does not
/// see at first (the layer's test hook holds them back for 300 ms, longer
/// than the quiet window). Then the same program with completions held
/// back longer than the drain may wait: each dump is refused by name and
/// the program goes on untouched.
const ATOMIC_SCRIPT: &str = r#"#!/bin/sh
S=$CKPT_IB_SCRATCH
cd "$S"
export CKPT_IMAGE_KEY=$S/key CKPT_IB_LAYER=$S/libckpt_ibverbs.so
(umask 077; head -c 32 /dev/urandom >"$CKPT_IMAGE_KEY")
ready() {
    i=0; while [ ! -e $1 ] && [ $i -lt 600 ]; do sleep 0.1; i=$((i+1)); done
}
D=$S/pause-atomic; mkdir -p $D
CKPT_IB_TEST_DRAIN_BLIND_MS=300 ./ckpt run --ib -- ./rc_atomic_restart rxe0 --pause $D >atomic.out 2>&1 </dev/null &
W=$!; P=$W
for n in 1 2; do
    ready $D/ready-$n
    ./ckpt -v dump --tree $P --dir img-atomic-$n --kill >>atomic-ckpt.out 2>&1 || { echo "atomic dump $n failed"; break; }
    wait $W
    ./ckpt -v restore --dir img-atomic-$n >>atomic-ckpt.out 2>&1 </dev/null &
    W=$!
    i=0; while [ "$(grep -c 'restored pid' atomic-ckpt.out)" -lt $n ] && [ $i -lt 600 ]; do sleep 0.1; i=$((i+1)); done
    touch $D/go-$n
done
wait $W; echo "atomic exit $?"
D=$S/pause-late; mkdir -p $D
CKPT_IB_TEST_DRAIN_BLIND_MS=5000 ./ckpt run --ib -- ./rc_atomic_restart rxe0 --pause $D >late.out 2>&1 </dev/null &
W=$!
for n in 1 2; do
    ready $D/ready-$n
    ./ckpt -v dump --tree $W --dir img-late-$n --kill >>late-refused.out 2>&1; echo "late dump $n exit $?"
    [ -e img-late-$n ] && echo "late dump $n left a directory"
    touch $D/go-$n
done
wait $W; echo "late exit $?"
"#;

/// One test's guests at a time: more TCG guests than cores each run at a
/// fraction of the speed, past their timeouts.
static ONE_GUEST: std::sync::Mutex<()> = std::sync::Mutex::new(());

/// Compiles `src` (in the workspace) to `out` against the host's
/// libibverbs (the guests run the host's tree).
fn compile(src: &str, out: &Path) {
    let cc = Command::new("gcc")
        .args(["-O1", "-Wall", "-Werror", "-o"])
        .arg(out)
        .arg(workspace().join(src))
        .arg("-libverbs")
        .output()
        .expect("run gcc");
    assert!(
        cc.status.success(),
        "gcc {src} -libverbs: {}",
        String::from_utf8_lossy(&cc.stderr)
    );
}

fn compile_pingpong(out: &Path) {
    compile("tests/c/ib/rc_pingpong.c", out);
}

/// The stream checksums both sides reported.
fn checksums(out: &str) -> Vec<String> {
    out.lines()
        .filter(|l| l.contains("stream ok"))
        .filter_map(|l| l.split("checksum=").nth(1).map(str::to_string))
        .collect()
}

/// What a guest run left: its stdout and the scratch directory's files.
struct GuestRun {
    stdout: String,
    scratch: tempfile::TempDir,
    all: String,
}

impl GuestRun {
    fn read(&self, name: &str) -> String {
        fs::read_to_string(self.scratch.path().join(name)).unwrap_or_default()
    }
}

/// Boots the VM on `script` with ckpt, the layer and rc_pingpong in its
/// scratch directory; `files` are shown when an assertion fails.
fn run_in_guest(script_text: &str, files: &[&str]) -> GuestRun {
    run_in_guest_with(script_text, files, &[])
}

/// [`run_in_guest`] with more of tests/c/ib compiled into the scratch
/// directory (`name.c` to `name`).
fn run_in_guest_with(script_text: &str, files: &[&str], programs: &[&str]) -> GuestRun {
    let _guest = ONE_GUEST.lock().unwrap_or_else(|e| e.into_inner());
    guest::setup(&[]);
    let scratch = guest::scratch("ckpt-ib-ckpt.");
    let s = scratch.path();
    guest::copy_executable(Path::new(CKPT), &s.join("ckpt"));
    fs::copy(verbs_layer_library(), s.join("libckpt_ibverbs.so")).expect("copy the layer");
    compile_pingpong(&s.join("rc_pingpong"));
    for p in programs {
        compile(&format!("tests/c/ib/{p}.c"), &s.join(p));
    }
    let script = script_text
        .replace("LONG_MESSAGES", &LONG_MESSAGES.to_string())
        .replace("MESSAGES", &MESSAGES.to_string());
    let out = guest::run(None, s, "guest.sh", &script, VM_TIMEOUT_SECS);
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    let mut all = format!(
        "vm stdout:\n{stdout}\nvm stderr:\n{}\n",
        String::from_utf8_lossy(&out.stderr)
    );
    for f in files {
        all.push_str(&format!(
            "--- {f}\n{}",
            fs::read_to_string(s.join(f)).unwrap_or_default()
        ));
    }
    assert!(out.status.success(), "{all}");
    GuestRun {
        stdout,
        scratch,
        all,
    }
}

#[test]
fn a_verbs_job_is_dumped_mid_stream_and_finishes_it_after_restore() {
    let g = run_in_guest(
        GUEST_SCRIPT,
        &[
            "ref.out",
            "plain.out",
            "refused.out",
            "job.out",
            "dump.out",
            "show.out",
            "restore.out",
            "links.out",
        ],
    );
    let (stdout, all) = (&g.stdout, &g.all);
    let read = |name: &str| g.read(name);

    let reference = checksums(&read("ref.out"));
    assert!(
        stdout.contains("reference exit 0") && reference.len() == 2 && reference[0] == reference[1],
        "the uninterrupted run: {all}"
    );

    // Without the layer: refused by name, the job untouched.
    let refused = read("refused.out");
    assert!(
        !stdout.contains("plain dump exit 0")
            && refused.contains("verbs device without the verbs layer")
            && refused.contains("ckpt run --ib"),
        "{all}"
    );
    assert!(
        stdout.contains("plain job exit 0") && checksums(&read("plain.out")) == reference,
        "the job a refused dump left: {all}"
    );

    // With it: dumped mid-stream, restored, the stream completes intact.
    let dump = read("dump.out");
    assert!(
        stdout.contains("dump exit 0") && dump.contains("verbs drained") && dump.contains("killed"),
        "{all}"
    );
    assert!(
        read("show.out").contains("verbs /dev/infiniband/uverbs")
            && read("show.out").contains("InfiniBand verbs (recreated by its verbs layer"),
        "{all}"
    );
    // Restored onto a device of another name (the one it had is gone).
    let links = read("links.out");
    assert!(
        stdout.contains("device moved exit 0")
            && links.contains("rxe_moved")
            && !links.contains("rxe0"),
        "{all}"
    );
    let restore = read("restore.out");
    assert!(
        stdout.contains("restore exit 0")
            && restore.contains("recreated their resources")
            && restore.contains("reconnected"),
        "{all}"
    );
    let job = read("job.out");
    assert!(
        job.contains("launcher: job exit 0"),
        "the launching shell, restored with the layer and no verbs object: {all}"
    );
    assert_eq!(
        checksums(&job),
        reference,
        "the restored job's stream differs from the uninterrupted one: {all}"
    );
    // Dumped mid-stream: the job had not finished when it was killed (its
    // two "stream ok" lines come from the restored processes).
    assert!(!dump.contains("no such process"), "{all}");
}

#[test]
fn verbs_ranks_launched_by_mpirun_are_dumped_and_restored_with_their_launcher() {
    let g = run_in_guest(
        MPIRUN_SCRIPT,
        &[
            "ref-mpirun.out",
            "ref-rank0.out",
            "ref-rank1.out",
            "mpirun.out",
            "rank0.out",
            "rank1.out",
            "dump.out",
            "restore.out",
        ],
    );
    let (stdout, all) = (&g.stdout, &g.all);
    let reference: Vec<String> = ["ref-rank0.out", "ref-rank1.out"]
        .iter()
        .flat_map(|f| checksums(&g.read(f)))
        .collect();
    assert!(
        stdout.contains("reference exit 0") && reference.len() == 2 && reference[0] == reference[1],
        "the uninterrupted run under mpirun: {all}"
    );
    let dump = g.read("dump.out");
    assert!(
        stdout.contains("dump exit 0") && dump.contains("verbs drained") && dump.contains("killed"),
        "{all}"
    );
    assert!(stdout.contains("restore exit 0"), "{all}");
    let restored: Vec<String> = ["rank0.out", "rank1.out"]
        .iter()
        .flat_map(|f| checksums(&g.read(f)))
        .collect();
    assert_eq!(
        restored, reference,
        "the restored ranks' streams differ from the uninterrupted ones: {all}"
    );
    let launched = g.read("mpirun.out");
    assert!(
        launched.contains("rank 0 exit 0") && launched.contains("rank 1 exit 0"),
        "mpirun, restored, forwards its ranks' ends: {all}"
    );
}

#[test]
fn a_verbs_job_of_two_nodes_restarts_through_the_coordinator() {
    let g = run_in_guest(
        TWO_NODES_SCRIPT,
        &[
            "ref-s.out",
            "ref-c.out",
            "job-s.out",
            "job-c.out",
            "dump1.out",
            "dump2.out",
            "restore1.out",
            "restore2.out",
            "coord.out",
        ],
    );
    let (stdout, all) = (&g.stdout, &g.all);
    let mut reference = checksums(&g.read("ref-s.out"));
    reference.extend(checksums(&g.read("ref-c.out")));
    assert!(
        stdout.contains("reference done") && reference.len() == 2 && reference[0] == reference[1],
        "the uninterrupted run: {all}"
    );
    for n in ["1", "2"] {
        assert!(
            stdout.contains(&format!("dump{n} exit 0"))
                && g.read(&format!("dump{n}.out")).contains("verbs drained")
                && g.read(&format!("dump{n}.out"))
                    .contains("committed, killed"),
            "node {n}'s dump: {all}"
        );
        assert!(
            stdout.contains(&format!("restore{n} exit 0"))
                && g.read(&format!("restore{n}.out"))
                    .contains("verbs: 1 processes reconnected"),
            "node {n}'s restore: {all}"
        );
    }
    assert_eq!(checksums(&g.read("job-s.out")), reference[..1], "{all}");
    assert_eq!(checksums(&g.read("job-c.out")), reference[..1], "{all}");
}

#[test]
fn rdma_cores_ibv_rc_pingpong_restarts_as_two_nodes_polling_and_on_events() {
    let mut files = Vec::new();
    for t in ["poll", "event"] {
        for f in ["s", "c", "dump1", "dump2", "restore1", "restore2", "coord"] {
            files.push(format!("{t}-{f}.out"));
        }
    }
    let refs: Vec<&str> = files.iter().map(String::as_str).collect();
    let g = run_in_guest(RDMA_CORE_SCRIPT, &refs);
    let (stdout, all) = (&g.stdout, &g.all);
    for (t, iters) in [("poll", 1500), ("event", 15000)] {
        for n in ["1", "2"] {
            assert!(
                stdout.contains(&format!("{t} dump{n} exit 0"))
                    && g.read(&format!("{t}-dump{n}.out"))
                        .contains("verbs drained"),
                "{t}: node {n}'s dump: {all}"
            );
            assert!(
                stdout.contains(&format!("{t} restore{n} exit 0")),
                "{t}: node {n}'s restore: {all}"
            );
        }
        for side in ["s", "c"] {
            assert!(
                g.read(&format!("{t}-{side}.out"))
                    .contains(&format!("{iters} iters in")),
                "{t}: ibv_rc_pingpong's {side} did not finish its {iters} iterations: {all}"
            );
        }
    }
}

#[test]
fn a_verbs_job_on_two_guests_restarts_across_their_link() {
    let _guests = ONE_GUEST.lock().unwrap_or_else(|e| e.into_inner());
    guest::setup(&[]);
    let scratch = guest::scratch("ckpt-ib-link.");
    let s = scratch.path();
    guest::copy_executable(Path::new(CKPT), &s.join("ckpt"));
    fs::copy(verbs_layer_library(), s.join("libckpt_ibverbs.so")).expect("copy the layer");
    compile_pingpong(&s.join("rc_pingpong"));
    // One image key for both nodes.
    let key: Vec<u8> = (0..32u8)
        .map(|i| i.wrapping_mul(37) ^ (std::process::id() as u8))
        .collect();
    fs::write(s.join("key"), key).expect("write the image key");
    fs::set_permissions(s.join("key"), fs::Permissions::from_mode(0o600)).expect("chmod key");
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("a free port")
        .port()
        .to_string();
    let spawn = |node: &str, side: &str| {
        let text = LINKED_SCRIPT
            .replace("NODE", node)
            .replace("SIDE", side)
            .replace("MESSAGES", &MESSAGES.to_string());
        let path = s.join(format!("guest{node}.sh"));
        write_executable(&path, &text);
        Command::new(workspace().join("scripts/ib-vm.sh"))
            .args(["run", "--timeout", &LINKED_TIMEOUT_SECS.to_string()])
            .args(["--link", &port, "--node", node, "--scratch"])
            .arg(s)
            .arg("--")
            .arg(&path)
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .expect("run scripts/ib-vm.sh")
    };
    let first = spawn("1", "s");
    // Node 1's QEMU listens on the link before node 2's connects.
    std::thread::sleep(std::time::Duration::from_secs(2));
    let second = spawn("2", "c");
    let (one, two) = (
        first.wait_with_output().expect("guest 1"),
        second.wait_with_output().expect("guest 2"),
    );
    let read = |name: &str| fs::read_to_string(s.join(name)).unwrap_or_default();
    let mut all = String::new();
    for (n, o) in [("1", &one), ("2", &two)] {
        all.push_str(&format!(
            "guest {n}: {}\nstdout:\n{}\nstderr:\n{}\n",
            o.status,
            String::from_utf8_lossy(&o.stdout),
            String::from_utf8_lossy(&o.stderr)
        ));
    }
    for f in [
        "ref-s.out",
        "ref-c.out",
        "job-s.out",
        "job-c.out",
        "dump1.out",
        "dump2.out",
        "restore1.out",
        "restore2.out",
        "coord.out",
    ] {
        all.push_str(&format!("--- {f}\n{}", read(f)));
    }
    for (n, o) in [("1", &one), ("2", &two)] {
        let out = String::from_utf8_lossy(&o.stdout);
        assert!(
            o.status.success()
                && out.contains("reference exit 0")
                && out.contains("dump exit 0")
                && out.contains("restore exit 0"),
            "guest {n}: {all}"
        );
    }
    let mut reference = checksums(&read("ref-s.out"));
    reference.extend(checksums(&read("ref-c.out")));
    assert!(
        reference.len() == 2 && reference[0] == reference[1],
        "the uninterrupted run across the link: {all}"
    );
    assert!(
        read("dump1.out").contains("verbs drained") && read("dump2.out").contains("verbs drained"),
        "{all}"
    );
    assert_eq!(checksums(&read("job-s.out")), reference[..1], "{all}");
    assert_eq!(checksums(&read("job-c.out")), reference[..1], "{all}");
}

#[test]
fn rdma_ud_and_srq_programs_restart_through_ckpt_at_every_point() {
    let g = run_in_guest_with(
        EXTERNAL_SCRIPT,
        &[
            "rc_restart.out",
            "rc_restart-ckpt.out",
            "ud_srq_restart.out",
            "ud_srq_restart-ckpt.out",
            "held.out",
            "held-refused.out",
            "held-ckpt.out",
        ],
        &["rc_restart", "ud_srq_restart"],
    );
    let (stdout, all) = (&g.stdout, &g.all);
    assert!(
        stdout.contains("rc_restart exit 0")
            && g.read("rc_restart.out").contains("rc_restart: ok rounds=2")
            && g.read("rc_restart.out").contains("event across restart")
            && g.read("rc_restart.out")
                .contains("event read across restart"),
        "{all}"
    );
    assert!(
        stdout.contains("ud_srq_restart exit 0")
            && g.read("ud_srq_restart.out")
                .contains("ud_srq_restart: ok rounds=2"),
        "{all}"
    );
    // The dumps found work in flight: sends waiting on RNR and completions
    // to drain (the event test's among them).
    let rc_log = g.read("rc_restart-ckpt.out");
    assert_eq!(rc_log.matches("verbs drained").count(), 4, "{all}");
    assert!(
        rc_log.contains("sends outstanding") && !rc_log.contains("drained: 0 completions"),
        "{all}"
    );
    // A thread inside malloc (its lock held): the restart would hang on
    // it, so the dump is refused by name and leaves the job as it was,
    // which later dumps and restores normally.
    assert!(
        stdout.contains("held dump exit ")
            && !stdout.contains("held dump exit 0")
            && !stdout.contains("held dump left a directory")
            && g.read("held-refused.out")
                .contains("a thread is inside malloc"),
        "{all}"
    );
    assert!(
        stdout.contains("held exit 0")
            && !stdout.contains("held dump 0 failed")
            && !stdout.contains("held dump 99 failed")
            && g.read("held.out").contains("the program went on")
            && g.read("held.out").contains("rc_restart: ok rounds=1"),
        "{all}"
    );
}

#[test]
fn fetch_and_adds_executed_before_a_dump_are_never_executed_again() {
    let g = run_in_guest_with(
        ATOMIC_SCRIPT,
        &[
            "atomic.out",
            "atomic-ckpt.out",
            "late.out",
            "late-refused.out",
        ],
        &["rc_atomic_restart"],
    );
    let (stdout, all) = (&g.stdout, &g.all);
    // Completions seen late: every fetch-and-add applied once, each
    // signaled one completed once with its own value.
    assert!(
        stdout.contains("atomic exit 0")
            && g.read("atomic.out")
                .contains("rc_atomic_restart: ok counter=16"),
        "{all}"
    );
    assert_eq!(
        g.read("atomic-ckpt.out").matches("verbs drained").count(),
        2,
        "{all}"
    );
    // Never seen within the drain: refused by name, the job untouched.
    for n in 1..=2 {
        assert!(
            stdout.contains(&format!("late dump {n} exit "))
                && !stdout.contains(&format!("late dump {n} exit 0"))
                && !stdout.contains(&format!("late dump {n} left a directory")),
            "{all}"
        );
    }
    let refused = g.read("late-refused.out");
    assert!(
        refused.matches("not known to have executed").count() == 2
            && refused.contains("fetch-and-add"),
        "{all}"
    );
    assert!(
        stdout.contains("late exit 0")
            && g.read("late.out")
                .contains("rc_atomic_restart: ok counter=16"),
        "{all}"
    );
}
