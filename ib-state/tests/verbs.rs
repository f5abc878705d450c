//! The safe layer on a real device: rxe0 in the SoftRoCE VM of
//! scripts/ib-vm.sh. Run on the host, the test re-runs its own binary inside
//! the VM (the harness sets CKPT_IB_VM=1 there) and checks the outcome;
//! a missing harness prerequisite fails the test with the harness's message.

use ckpt_ib_state::{Context, Gid, sys};
use std::path::Path;
use std::process::Command;

const DEVICE: &str = "rxe0";
const PORT: u8 = 1;
/// The address scripts/ib-vm.sh gives rxe0's netdev, as an IPv4-mapped GID.
const HARNESS_GID: [u8; 16] = [0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff, 10, 213, 0, 1];
const CQ_DEPTH: u32 = 16;
const VM_TIMEOUT_SECS: &str = "50";
const DONE: &str = "ib-state verbs checks done";

#[test]
fn verbs_objects_on_rxe0() {
    if std::env::var_os("CKPT_IB_VM").is_some() {
        in_vm();
        println!("{DONE}");
        return;
    }
    let harness = Path::new(env!("CARGO_MANIFEST_DIR")).join("../scripts/ib-vm.sh");
    let exe = std::env::current_exe().expect("current exe");
    let out = Command::new(harness)
        .args(["run", "--timeout", VM_TIMEOUT_SECS, "--"])
        .arg(exe)
        .args([
            "verbs_objects_on_rxe0",
            "--exact",
            "--nocapture",
            "--test-threads=1",
        ])
        .output()
        .expect("run scripts/ib-vm.sh");
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        out.status.success() && stdout.contains(DONE),
        "verbs checks in the SoftRoCE VM failed ({}):\nstdout:\n{stdout}\nstderr:\n{stderr}",
        out.status
    );
}

fn in_vm() {
    let devices = ckpt_ib_state::devices().expect("list devices");
    let dev = devices
        .iter()
        .find(|d| d.name == DEVICE)
        .expect("rxe0 listed");
    assert_ne!(dev.guid, 0, "rxe0 has a node GUID");

    let ctx = Context::open(DEVICE).expect("open rxe0");
    let fd_target = std::fs::read_link(format!("/proc/self/fd/{}", ctx.cmd_fd())).unwrap();
    assert!(
        fd_target
            .to_string_lossy()
            .starts_with("/dev/infiniband/uverbs"),
        "command fd is {}",
        fd_target.display()
    );
    match Context::open("nosuchdev0") {
        Err(ckpt_ib_state::Error::NoDevice { available, .. }) => {
            assert!(available.contains(DEVICE))
        }
        other => panic!("opening a missing device: {:?}", other.err()),
    }

    let port = ctx.query_port(PORT).expect("query port");
    assert_eq!(port.state, sys::IBV_PORT_ACTIVE);
    assert_eq!(port.link_layer, sys::IBV_LINK_LAYER_ETHERNET, "rxe is RoCE");
    assert!(port.gid_table_len > 1);
    let gids: Vec<Gid> = (0..port.gid_table_len)
        .filter_map(|i| ctx.query_gid(PORT, i).ok())
        .collect();
    assert!(
        gids.contains(&Gid(HARNESS_GID)),
        "no GID for 10.213.0.1 in {gids:x?}"
    );

    // The ops table the inline data-path verbs go through is populated by the
    // rxe provider.
    // SAFETY: the context is open; reading the table is a plain load.
    let ops = unsafe { &(*ctx.as_raw()).ops };
    assert!(ops.post_send.is_some() && ops.post_recv.is_some() && ops.poll_cq.is_some());

    let pd = ctx.alloc_pd().expect("alloc pd");
    let pd2 = ctx.alloc_pd().expect("alloc second pd");
    assert_ne!(pd.handle(), pd2.handle());
    let cq = ctx.create_cq(CQ_DEPTH).expect("create cq");
    assert!(cq.capacity() >= CQ_DEPTH as i32);
    // An empty CQ polled through the ops table, as ibv_poll_cq does.
    let mut wc = sys::ibv_wc::default();
    let poll = ops.poll_cq.unwrap();
    // SAFETY: live CQ of this context, room for one completion.
    assert_eq!(unsafe { poll(cq.as_raw(), 1, &mut wc) }, 0);

    let cap = sys::ibv_qp_cap {
        max_send_wr: 4,
        max_recv_wr: 4,
        max_send_sge: 1,
        max_recv_sge: 1,
        max_inline_data: 0,
    };
    let qp = pd
        .create_qp(&cq, sys::IBV_QPT_RC, cap)
        .expect("create rc qp");
    let qp2 = pd
        .create_qp(&cq, sys::IBV_QPT_UD, cap)
        .expect("create ud qp");
    // QPNs 0 and 1 are the special QPs; ordinary ones come after.
    assert!(qp.qp_num() > 1 && qp2.qp_num() > 1);
    assert_ne!(qp.qp_num(), qp2.qp_num());
    assert_eq!(qp.state(), sys::IBV_QPS_RESET);

    let mut a = vec![0u8; 4096];
    let mut b = vec![0u8; 4096];
    let mr_a = pd.reg_mr(&mut a, true).expect("reg mr");
    let mr_b = pd.reg_mr(&mut b, false).expect("reg mr");
    assert_ne!(mr_a.lkey(), mr_b.lkey());
    println!(
        "rxe0 guid={:016x} qp_num={} {} pd={} cq={} lkey={:#x} rkey={:#x}",
        dev.guid,
        qp.qp_num(),
        qp2.qp_num(),
        pd.handle(),
        cq.handle(),
        mr_a.lkey(),
        mr_a.rkey()
    );
}
