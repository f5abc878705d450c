//! Every hand-written binding in `sys.rs` has the size and field offsets of
//! the installed `verbs.h`, as the C compiler lays it out.

use ckpt_ib_state::sys;
use std::mem::{offset_of, size_of};
use std::process::Command;

/// (C struct, C field or "" for sizeof, what Rust says).
fn rust_layout() -> Vec<(&'static str, &'static str, usize)> {
    macro_rules! layout {
        ($c:literal, $t:ty, [$($f:ident),*]) => {
            vec![($c, "", size_of::<$t>()), $(($c, stringify!($f), offset_of!($t, $f))),*]
        };
    }
    let mut v = Vec::new();
    v.extend(layout!(
        "ibv_device",
        sys::ibv_device,
        [
            node_type,
            transport_type,
            name,
            dev_name,
            dev_path,
            ibdev_path
        ]
    ));
    v.extend(layout!(
        "ibv_context_ops",
        sys::ibv_context_ops,
        [
            alloc_mw,
            poll_cq,
            req_notify_cq,
            post_srq_recv,
            post_send,
            post_recv,
            _compat_async_event
        ]
    ));
    v.extend(layout!(
        "ibv_context",
        sys::ibv_context,
        [
            device,
            ops,
            cmd_fd,
            async_fd,
            num_comp_vectors,
            mutex,
            abi_compat
        ]
    ));
    v.extend(layout!(
        "ibv_port_attr",
        sys::ibv_port_attr,
        [state, gid_tbl_len, lid, link_layer, flags, port_cap_flags2]
    ));
    v.extend(layout!("ibv_pd", sys::ibv_pd, [context, handle]));
    v.extend(layout!(
        "ibv_mr",
        sys::ibv_mr,
        [context, pd, addr, length, handle, lkey, rkey]
    ));
    v.extend(layout!(
        "ibv_cq",
        sys::ibv_cq,
        [
            context,
            channel,
            cq_context,
            handle,
            cqe,
            mutex,
            cond,
            comp_events_completed,
            async_events_completed
        ]
    ));
    v.extend(layout!(
        "ibv_qp",
        sys::ibv_qp,
        [
            context,
            qp_context,
            pd,
            send_cq,
            recv_cq,
            srq,
            handle,
            qp_num,
            state,
            qp_type,
            mutex,
            cond,
            events_completed
        ]
    ));
    v.extend(layout!(
        "ibv_qp_cap",
        sys::ibv_qp_cap,
        [max_send_wr, max_inline_data]
    ));
    v.extend(layout!(
        "ibv_qp_init_attr",
        sys::ibv_qp_init_attr,
        [qp_context, send_cq, recv_cq, srq, cap, qp_type, sq_sig_all]
    ));
    v.extend(layout!("ibv_sge", sys::ibv_sge, [addr, length, lkey]));
    v.extend(layout!(
        "ibv_recv_wr",
        sys::ibv_recv_wr,
        [wr_id, next, sg_list, num_sge]
    ));
    v.extend(layout!(
        "ibv_send_wr",
        sys::ibv_send_wr,
        [
            wr_id, next, sg_list, num_sge, opcode, send_flags, imm_data, wr, qp_type
        ]
    ));
    v.extend(layout!(
        "ibv_wc",
        sys::ibv_wc,
        [
            wr_id,
            status,
            opcode,
            vendor_err,
            byte_len,
            imm_data,
            qp_num,
            src_qp,
            wc_flags,
            pkey_index,
            slid,
            sl,
            dlid_path_bits
        ]
    ));
    v.extend(layout!("ibv_gid", sys::ibv_gid, [raw]));
    v.extend(layout!(
        "ibv_comp_channel",
        sys::ibv_comp_channel,
        [context, fd, refcnt]
    ));
    v.extend(layout!(
        "ibv_srq",
        sys::ibv_srq,
        [
            context,
            srq_context,
            pd,
            handle,
            mutex,
            cond,
            events_completed
        ]
    ));
    v.extend(layout!(
        "ibv_srq_attr",
        sys::ibv_srq_attr,
        [max_wr, max_sge, srq_limit]
    ));
    v.extend(layout!(
        "ibv_srq_init_attr",
        sys::ibv_srq_init_attr,
        [srq_context, attr]
    ));
    v.extend(layout!(
        "ibv_global_route",
        sys::ibv_global_route,
        [dgid, flow_label, sgid_index, hop_limit, traffic_class]
    ));
    v.extend(layout!(
        "ibv_ah_attr",
        sys::ibv_ah_attr,
        [
            grh,
            dlid,
            sl,
            src_path_bits,
            static_rate,
            is_global,
            port_num
        ]
    ));
    v.extend(layout!("ibv_ah", sys::ibv_ah, [context, pd, handle]));
    v.extend(layout!(
        "ibv_qp_attr",
        sys::ibv_qp_attr,
        [
            qp_state,
            cur_qp_state,
            path_mtu,
            path_mig_state,
            qkey,
            rq_psn,
            sq_psn,
            dest_qp_num,
            qp_access_flags,
            cap,
            ah_attr,
            alt_ah_attr,
            pkey_index,
            alt_pkey_index,
            en_sqd_async_notify,
            sq_draining,
            max_rd_atomic,
            max_dest_rd_atomic,
            min_rnr_timer,
            port_num,
            timeout,
            retry_cnt,
            rnr_retry,
            alt_port_num,
            alt_timeout,
            rate_limit
        ]
    ));
    v.extend(layout!(
        "ibv_async_event",
        sys::ibv_async_event,
        [element, event_type]
    ));
    v
}

#[test]
fn bindings_match_verbs_h() {
    let layout = rust_layout();
    let mut c = String::from(
        "#include <stddef.h>\n#include <stdio.h>\n#include <infiniband/verbs.h>\nint main(void) {\n",
    );
    for (s, f, _) in &layout {
        // ibv_gid is a union in C; the Rust struct holds its raw view.
        let ty = if *s == "ibv_gid" {
            format!("union {s}")
        } else {
            format!("struct {s}")
        };
        if f.is_empty() {
            c.push_str(&format!("printf(\"%zu\\n\", sizeof({ty}));\n"));
        } else {
            c.push_str(&format!("printf(\"%zu\\n\", offsetof({ty}, {f}));\n"));
        }
    }
    c.push_str("return 0; }\n");
    let dir = tempfile_dir();
    let src = dir.join("layout.c");
    let bin = dir.join("layout");
    std::fs::write(&src, c).unwrap();
    let out = Command::new("gcc")
        .arg("-o")
        .arg(&bin)
        .arg(&src)
        .output()
        .expect("run gcc");
    assert!(
        out.status.success(),
        "compiling against verbs.h failed (libibverbs-dev installed?): {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let out = Command::new(&bin).output().expect("run layout probe");
    let c_values: Vec<usize> = String::from_utf8_lossy(&out.stdout)
        .lines()
        .map(|l| l.parse().unwrap())
        .collect();
    assert_eq!(c_values.len(), layout.len());
    let wrong: Vec<String> = layout
        .iter()
        .zip(&c_values)
        .filter(|((_, _, rust), c)| rust != *c)
        .map(|((s, f, rust), c)| format!("{s}.{f}: rust {rust}, C {c}"))
        .collect();
    assert!(wrong.is_empty(), "layout differs from verbs.h: {wrong:#?}");
    std::fs::remove_dir_all(&dir).ok();
}

fn tempfile_dir() -> std::path::PathBuf {
    let dir = std::path::Path::new(env!("CARGO_TARGET_TMPDIR"))
        .join(format!("ib-layout-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    dir
}
