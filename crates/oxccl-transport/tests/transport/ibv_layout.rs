//! The libibverbs binding against the installed `<infiniband/verbs.h>`,
//! as the C compiler sees it.
//!
//! - Layouts: every entry of `ibv::layout_table()` becomes a line of a small
//!   C program (`sizeof`, `offsetof` or the constant's value); the program
//!   is compiled with `cc` and run, and each number compared with Rust's.
//! - Calls: a fake libibverbs, compiled from C against the same header and
//!   exported at the same symbol versions, plays an HCA whose QPs copy at
//!   post time; the binding drives it through every call (loading, ports,
//!   GIDs, registration, CQs with their channel, QPs from INIT to RTS with
//!   NCCL's masks, WRITE_WITH_IMM, READ, lists of work requests, teardown
//!   order). The fake refuses what it does not expect and aborts on a
//!   teardown in the wrong order.
//!
//! Where the header or a C compiler is missing, the tests say so and pass,
//! or fail where `OXCCL_REQUIRE_IBVERBS` or `OXCCL_REQUIRE_CC` is set (CI).

use oxccl_transport::Error;
use oxccl_transport::rdma::env::{HcaFilter, choose_gid, gid_to_string};
use oxccl_transport::rdma::ibv::{UnavailableKind, layout_table, open_devices};
use oxccl_transport::rdma::verbs::{
    Access, Completion, Connect, Cq, GidType, LinkLayer, Opcode, PortState, QpCaps, QpState, RecvWr, SendWr, Status,
    WcOpcode,
};
use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Arc;

const HEADER: &str = "/usr/include/infiniband/verbs.h";

/// The C compiler, where it and the header are here; else `None`, said
/// why: a skip, or a failure where `OXCCL_REQUIRE_IBVERBS` (the header) or
/// `OXCCL_REQUIRE_CC` (the compiler) is set.
fn verbs_h_and_cc() -> Option<String> {
    if !Path::new(HEADER).exists() {
        oxccl_skip::skip_or_fail(
            "OXCCL_REQUIRE_IBVERBS",
            format!("{HEADER} is absent (apt-get install libibverbs-dev)"),
        );
        return None;
    }
    let cc = std::env::var("CC").unwrap_or_else(|_| "cc".to_string());
    if let Err(e) = Command::new(&cc).arg("--version").output() {
        oxccl_skip::skip_or_fail("OXCCL_REQUIRE_CC", format!("no C compiler ({cc}: {e}) to compile against {HEADER}"));
        return None;
    }
    Some(cc)
}

/// The C expression for one table entry.
fn c_expr(key: &str) -> String {
    if key.starts_with("IBV_") {
        return format!("(size_t)({key})");
    }
    match key.split_once('.') {
        None => format!("sizeof({key})"),
        Some((ty, field)) => format!("offsetof({ty}, {field})"),
    }
}

fn program(table: &[(&str, usize)]) -> String {
    let mut c =
        String::from("#include <stddef.h>\n#include <stdio.h>\n#include <infiniband/verbs.h>\n\nint main(void) {\n");
    for (key, _) in table {
        c.push_str(&format!("    printf(\"%s\\t%zu\\n\", \"{key}\", {});\n", c_expr(key)));
    }
    c.push_str("    return 0;\n}\n");
    c
}

#[test]
fn rust_layouts_match_verbs_h() {
    let Some(cc) = verbs_h_and_cc() else { return };
    let table = layout_table();
    assert!(table.len() > 100, "the table covers every field relied on ({} entries)", table.len());
    let dir = std::env::temp_dir().join(format!("oxccl-ibv-layout-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let (src, exe) = (dir.join("layout.c"), dir.join("layout"));
    std::fs::write(&src, program(&table)).unwrap();
    let out = Command::new(&cc).arg("-o").arg(&exe).arg(&src).output().expect("run the C compiler");
    assert!(
        out.status.success(),
        "{cc} could not compile the layout program against {HEADER} (a field this binding names no longer \
         exists?):\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let run = Command::new(&exe).output().expect("run the layout program");
    assert!(run.status.success());
    let _ = std::fs::remove_dir_all(&dir);
    let c: HashMap<String, usize> = String::from_utf8(run.stdout)
        .unwrap()
        .lines()
        .map(|l| {
            let (k, v) = l.split_once('\t').expect("key<TAB>value");
            (k.to_string(), v.parse().expect("a number"))
        })
        .collect();
    let mut wrong = Vec::new();
    for (key, rust) in &table {
        match c.get(*key) {
            Some(cv) if cv == rust => {}
            Some(cv) => wrong.push(format!("{key}: C says {cv}, Rust says {rust}")),
            None => wrong.push(format!("{key}: not printed by the C program")),
        }
    }
    assert!(wrong.is_empty(), "layouts differ from {HEADER}:\n{}", wrong.join("\n"));
    eprintln!("{} sizes, offsets and constants match {HEADER}", table.len());
}

#[test]
fn the_generator_writes_what_it_should() {
    assert_eq!(c_expr("struct ibv_wc"), "sizeof(struct ibv_wc)");
    assert_eq!(c_expr("union ibv_gid"), "sizeof(union ibv_gid)");
    assert_eq!(c_expr("struct ibv_send_wr.wr.rdma.rkey"), "offsetof(struct ibv_send_wr, wr.rdma.rkey)");
    assert_eq!(c_expr("IBV_WR_RDMA_READ"), "(size_t)(IBV_WR_RDMA_READ)");
    let keys: Vec<&str> = layout_table().iter().map(|e| e.0).collect();
    for must in [
        "struct ibv_context.ops.post_send",
        "struct ibv_qp_attr.ah_attr.grh.dgid",
        "struct ibv_send_wr.imm_data",
        "struct ibv_wc.imm_data",
        "struct ibv_port_attr.link_layer",
        "IBV_WC_RECV_RDMA_WITH_IMM",
        "IBV_QP_MAX_DEST_RD_ATOMIC",
    ] {
        assert!(keys.contains(&must), "{must} is checked");
    }
    let mut sorted = keys.clone();
    sorted.sort();
    sorted.dedup();
    assert_eq!(sorted.len(), keys.len(), "no entry twice");
}

/// A fake libibverbs (see the module's doc).
const FAKE_C: &str = r##"/* A fake libibverbs for oxccl's tests: one device "fake_0" with one
 * RoCE port; RC QPs on it are joined in process and "transfer" with
 * memcpy at post time. It checks what a real HCA would refuse (attribute
 * masks, state, access) and aborts on a teardown in the wrong order. */
#include <infiniband/verbs.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <arpa/inet.h>
#undef ibv_get_device_list
#undef ibv_query_port
#undef ibv_reg_mr

#define DIE(...) do { fprintf(stderr, "fake libibverbs: " __VA_ARGS__); fputc('\n', stderr); abort(); } while (0)

struct fchan { struct ibv_comp_channel ch; int wfd; struct ibv_cq *cq; };
struct fcq { struct ibv_cq cq; struct ibv_wc ring[1024]; unsigned head, tail; int armed, qps; };
struct fqp { struct ibv_qp qp; uint32_t dest; unsigned max_send, max_recv; uint64_t recv[256]; unsigned rh, rt; };

struct fctx { struct ibv_context c; int pd, mr, cq, chan, qp; };
#define LIVE(ctx) ((struct fctx *)(ctx))

static struct ibv_device dev;
static struct fqp *qps[64];
static uint32_t next_key = 0x100, next_qpn = 0x40;

int ibv_fork_init(void) { return 0; }
struct ibv_device **ibv_get_device_list(int *n) {
    struct ibv_device **l = calloc(2, sizeof *l);
    strcpy(dev.name, "fake_0");
    l[0] = &dev;
    *n = 1;
    return l;
}
void ibv_free_device_list(struct ibv_device **l) { free(l); }
const char *ibv_get_device_name(struct ibv_device *d) { return d->name; }
const char *ibv_wc_status_str(enum ibv_wc_status s) { return s ? "fake error" : "success"; }

static void push(struct ibv_cq *cq, struct ibv_wc wc) {
    struct fcq *c = (struct fcq *)cq;
    if (c->tail - c->head >= 1024) DIE("CQ overflow");
    c->ring[c->tail++ % 1024] = wc;
    if (c->armed && cq->channel) {
        c->armed = 0;
        struct fchan *f = (struct fchan *)cq->channel;
        if (write(f->wfd, "x", 1) != 1) DIE("channel write");
    }
}
static int poll_cq(struct ibv_cq *cq, int n, struct ibv_wc *wc) {
    struct fcq *c = (struct fcq *)cq;
    int i = 0;
    while (i < n && c->head != c->tail) wc[i++] = c->ring[c->head++ % 1024];
    return i;
}
static int req_notify_cq(struct ibv_cq *cq, int solicited) {
    if (solicited) DIE("solicited-only notification asked");
    ((struct fcq *)cq)->armed = 1;
    return 0;
}
static struct fqp *find(uint32_t qpn) {
    for (int i = 0; i < 64; i++) if (qps[i] && qps[i]->qp.qp_num == qpn) return qps[i];
    return NULL;
}
static int post_send(struct ibv_qp *qp, struct ibv_send_wr *wr, struct ibv_send_wr **bad) {
    struct fqp *q = (struct fqp *)qp;
    for (; wr; wr = wr->next) {
        *bad = wr;
        if (qp->state != IBV_QPS_RTS) return EINVAL;
        if (wr->num_sge > 1 || (wr->num_sge == 1 && !wr->sg_list)) return EINVAL;
        struct fqp *peer = find(q->dest);
        if (!peer) return EINVAL;
        uint32_t len = wr->num_sge ? wr->sg_list[0].length : 0;
        void *local = wr->num_sge ? (void *)(uintptr_t)wr->sg_list[0].addr : NULL;
        void *remote = (void *)(uintptr_t)wr->wr.rdma.remote_addr;
        struct ibv_wc wc = { .wr_id = wr->wr_id, .qp_num = qp->qp_num };
        switch (wr->opcode) {
        case IBV_WR_RDMA_WRITE_WITH_IMM:
            if (peer->rh == peer->rt) return EAGAIN; /* a real HCA would retry (RNR) */
            /* fall through */
        case IBV_WR_RDMA_WRITE:
            if (len) memcpy(remote, local, len);
            wc.opcode = IBV_WC_RDMA_WRITE;
            if (wr->opcode == IBV_WR_RDMA_WRITE_WITH_IMM) {
                struct ibv_wc r = { .wr_id = peer->recv[peer->rh++ % 256], .opcode = IBV_WC_RECV_RDMA_WITH_IMM,
                                    .byte_len = len, .imm_data = wr->imm_data, .wc_flags = IBV_WC_WITH_IMM,
                                    .qp_num = peer->qp.qp_num,
                                    /* what a responder reads from the wire, in host order */
                                    .vendor_err = ntohl(wr->imm_data) };
                push(peer->qp.recv_cq, r);
            }
            break;
        case IBV_WR_RDMA_READ:
            if (len) memcpy(local, remote, len);
            wc.opcode = IBV_WC_RDMA_READ;
            break;
        default:
            return EINVAL;
        }
        if (wr->send_flags & IBV_SEND_SIGNALED) push(qp->send_cq, wc);
    }
    *bad = NULL;
    return 0;
}
static int post_recv(struct ibv_qp *qp, struct ibv_recv_wr *wr, struct ibv_recv_wr **bad) {
    struct fqp *q = (struct fqp *)qp;
    for (; wr; wr = wr->next) {
        *bad = wr;
        if (q->rt - q->rh >= q->max_recv) return ENOMEM;
        if (wr->num_sge != 0) return EINVAL;
        q->recv[q->rt++ % 256] = wr->wr_id;
    }
    *bad = NULL;
    return 0;
}

struct ibv_context *ibv_open_device(struct ibv_device *d) {
    struct ibv_context *c = calloc(1, sizeof(struct fctx));
    int p[2];
    if (pipe(p)) return NULL;
    c->device = d;
    c->async_fd = p[0];
    c->cmd_fd = p[1];
    c->num_comp_vectors = 1;
    c->ops.poll_cq = poll_cq;
    c->ops.req_notify_cq = req_notify_cq;
    c->ops.post_send = post_send;
    c->ops.post_recv = post_recv;
    return c;
}
int ibv_close_device(struct ibv_context *c) {
    struct fctx *l = LIVE(c);
    if (l->pd || l->cq || l->chan || l->qp || l->mr)
        DIE("ibv_close_device with %d PDs, %d CQs, %d channels, %d QPs, %d MRs alive", l->pd, l->cq, l->chan, l->qp,
            l->mr);
    close(c->async_fd);
    close(c->cmd_fd);
    free(c);
    return 0;
}
int ibv_query_device(struct ibv_context *c, struct ibv_device_attr *a) {
    memset(a, 0, sizeof *a);
    a->phys_port_cnt = 1;
    a->max_qp_wr = 1024;
    a->max_cqe = 4096;
    a->max_qp_rd_atom = 16;
    a->max_qp_init_rd_atom = 16;
    return 0;
}
int ibv_query_port(struct ibv_context *c, uint8_t port, struct _compat_ibv_port_attr *out) {
    if (port != 1) return EINVAL;
    struct ibv_port_attr a;
    memset(&a, 0, sizeof a);
    a.state = IBV_PORT_ACTIVE;
    a.max_mtu = a.active_mtu = IBV_MTU_4096;
    a.gid_tbl_len = 3;
    a.lid = 0;
    a.active_width = 2;  /* 4x */
    a.active_speed = 32; /* EDR */
    a.link_layer = IBV_LINK_LAYER_ETHERNET;
    memcpy(out, &a, offsetof(struct ibv_port_attr, flags) + 1); /* the compat struct */
    return 0;
}
int ibv_query_gid(struct ibv_context *c, uint8_t port, int index, union ibv_gid *gid) {
    static const uint8_t ll[16] = {0xfe, 0x80, 0, 0, 0, 0, 0, 0, 2, 1, 2, 0xff, 0xfe, 3, 4, 5};
    static const uint8_t v4[16] = {0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff, 10, 1, 2, 3};
    if (port != 1 || index < 0 || index > 2) return EINVAL;
    memset(gid, 0, sizeof *gid);
    if (index == 0) memcpy(gid->raw, ll, 16);
    if (index == 2) memcpy(gid->raw, v4, 16);
    return 0;
}
struct ibv_pd *ibv_alloc_pd(struct ibv_context *c) {
    struct ibv_pd *pd = calloc(1, sizeof *pd);
    pd->context = c;
    LIVE(c)->pd++;
    return pd;
}
int ibv_dealloc_pd(struct ibv_pd *pd) {
    struct fctx *l = LIVE(pd->context);
    if (l->mr || l->qp) DIE("ibv_dealloc_pd with %d MRs and %d QPs alive", l->mr, l->qp);
    l->pd--;
    free(pd);
    return 0;
}
struct ibv_mr *ibv_reg_mr(struct ibv_pd *pd, void *addr, size_t len, int access) {
    if (!len || ((access & IBV_ACCESS_REMOTE_WRITE) && !(access & IBV_ACCESS_LOCAL_WRITE))) {
        errno = EINVAL;
        return NULL;
    }
    struct ibv_mr *mr = calloc(1, sizeof *mr);
    mr->context = pd->context;
    mr->pd = pd;
    mr->addr = addr;
    mr->length = len;
    mr->lkey = next_key++;
    mr->rkey = next_key++;
    LIVE(pd->context)->mr++;
    return mr;
}
int ibv_dereg_mr(struct ibv_mr *mr) {
    LIVE(mr->context)->mr--;
    free(mr);
    return 0;
}
struct ibv_comp_channel *ibv_create_comp_channel(struct ibv_context *c) {
    struct fchan *f = calloc(1, sizeof *f);
    int p[2];
    if (pipe(p)) return NULL;
    f->ch.context = c;
    f->ch.fd = p[0];
    f->wfd = p[1];
    LIVE(c)->chan++;
    return &f->ch;
}
int ibv_destroy_comp_channel(struct ibv_comp_channel *ch) {
    struct fchan *f = (struct fchan *)ch;
    if (f->cq) DIE("ibv_destroy_comp_channel with its CQ alive");
    close(f->ch.fd);
    close(f->wfd);
    LIVE(ch->context)->chan--;
    free(f);
    return 0;
}
struct ibv_cq *ibv_create_cq(struct ibv_context *c, int cqe, void *ctx, struct ibv_comp_channel *ch, int vec) {
    struct fcq *q = calloc(1, sizeof *q);
    q->cq.context = c;
    q->cq.channel = ch;
    q->cq.cq_context = ctx;
    q->cq.cqe = cqe;
    if (ch) ((struct fchan *)ch)->cq = &q->cq;
    LIVE(c)->cq++;
    return &q->cq;
}
int ibv_destroy_cq(struct ibv_cq *cq) {
    struct fcq *q = (struct fcq *)cq;
    if (q->qps) DIE("ibv_destroy_cq with %d QPs on it", q->qps);
    if (cq->channel) ((struct fchan *)cq->channel)->cq = NULL;
    LIVE(cq->context)->cq--;
    free(q);
    return 0;
}
int ibv_get_cq_event(struct ibv_comp_channel *ch, struct ibv_cq **cq, void **ctx) {
    char b;
    if (!(fcntl(ch->fd, F_GETFL) & O_NONBLOCK)) DIE("the completion channel is blocking");
    if (read(ch->fd, &b, 1) != 1) return -1;
    *cq = ((struct fchan *)ch)->cq;
    *ctx = (*cq)->cq_context;
    return 0;
}
void ibv_ack_cq_events(struct ibv_cq *cq, unsigned n) { cq->comp_events_completed += n; }
struct ibv_qp *ibv_create_qp(struct ibv_pd *pd, struct ibv_qp_init_attr *a) {
    if (a->send_cq->context != pd->context || a->recv_cq->context != pd->context) DIE("a CQ of another context");
    if (a->qp_type != IBV_QPT_RC || a->srq || a->cap.max_send_sge != 1 || a->cap.max_recv_sge != 1 || a->sq_sig_all) {
        errno = EINVAL;
        return NULL;
    }
    struct fqp *q = calloc(1, sizeof *q);
    q->qp.context = pd->context;
    q->qp.pd = pd;
    q->qp.send_cq = a->send_cq;
    q->qp.recv_cq = a->recv_cq;
    q->qp.qp_num = next_qpn++;
    q->qp.qp_type = IBV_QPT_RC;
    q->qp.state = IBV_QPS_RESET;
    q->max_send = a->cap.max_send_wr;
    q->max_recv = a->cap.max_recv_wr;
    a->cap.max_inline_data = 64;
    ((struct fcq *)a->send_cq)->qps++;
    ((struct fcq *)a->recv_cq)->qps++;
    for (int i = 0; i < 64; i++) if (!qps[i]) { qps[i] = q; break; }
    LIVE(pd->context)->qp++;
    return &q->qp;
}
#define RTR_MASK (IBV_QP_STATE | IBV_QP_AV | IBV_QP_PATH_MTU | IBV_QP_DEST_QPN | IBV_QP_RQ_PSN | \
                  IBV_QP_MAX_DEST_RD_ATOMIC | IBV_QP_MIN_RNR_TIMER)
#define RTS_MASK (IBV_QP_STATE | IBV_QP_TIMEOUT | IBV_QP_RETRY_CNT | IBV_QP_RNR_RETRY | IBV_QP_SQ_PSN | \
                  IBV_QP_MAX_QP_RD_ATOMIC)
#define INIT_MASK (IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_ACCESS_FLAGS)
int ibv_modify_qp(struct ibv_qp *qp, struct ibv_qp_attr *a, int mask) {
    struct fqp *q = (struct fqp *)qp;
    switch (a->qp_state) {
    case IBV_QPS_INIT:
        if (qp->state != IBV_QPS_RESET || mask != INIT_MASK || a->port_num != 1 || a->pkey_index != 0 ||
            a->qp_access_flags != (IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ))
            return EINVAL;
        break;
    case IBV_QPS_RTR:
        if (qp->state != IBV_QPS_INIT || mask != RTR_MASK || a->path_mtu != IBV_MTU_4096 || !find(a->dest_qp_num) ||
            a->ah_attr.port_num != 1 || !a->ah_attr.is_global || a->ah_attr.grh.hop_limit != 255 ||
            a->ah_attr.grh.sgid_index != 2 || a->ah_attr.grh.dgid.raw[10] != 0xff || a->min_rnr_timer != 12 ||
            a->max_dest_rd_atomic != 1 || a->ah_attr.sl != 3 || a->ah_attr.grh.traffic_class != 106)
            return EINVAL;
        q->dest = a->dest_qp_num;
        break;
    case IBV_QPS_RTS:
        if (qp->state != IBV_QPS_RTR || mask != RTS_MASK || a->timeout != 20 || a->retry_cnt != 7 ||
            a->rnr_retry != 7 || a->max_rd_atomic != 1)
            return EINVAL;
        break;
    case IBV_QPS_ERR:
        if (mask != IBV_QP_STATE) return EINVAL;
        break;
    default:
        return EINVAL;
    }
    qp->state = a->qp_state;
    return 0;
}
int ibv_destroy_qp(struct ibv_qp *qp) {
    for (int i = 0; i < 64; i++) if (qps[i] == (struct fqp *)qp) qps[i] = NULL;
    ((struct fcq *)qp->send_cq)->qps--;
    ((struct fcq *)qp->recv_cq)->qps--;
    LIVE(qp->context)->qp--;
    free(qp);
    return 0;
}
int ibv_get_async_event(struct ibv_context *c, struct ibv_async_event *ev) {
    char b;
    if (!(fcntl(c->async_fd, F_GETFL) & O_NONBLOCK)) DIE("the async event descriptor is blocking");
    if (read(c->async_fd, &b, 1) != 1) return -1;
    ev->event_type = IBV_EVENT_PORT_ACTIVE;
    ev->element.port_num = 1;
    return 0;
}
void ibv_ack_async_event(struct ibv_async_event *ev) {}
"##;

/// Its symbol versions: those of rdma-core.
const FAKE_MAP: &str = r##"IBVERBS_1.0 { global: ibv_create_comp_channel; ibv_destroy_comp_channel; };
IBVERBS_1.1 {
  global: ibv_fork_init; ibv_get_device_list; ibv_free_device_list; ibv_get_device_name; ibv_open_device;
    ibv_close_device; ibv_query_device; ibv_query_port; ibv_query_gid; ibv_alloc_pd; ibv_dealloc_pd; ibv_reg_mr;
    ibv_dereg_mr; ibv_create_cq; ibv_destroy_cq; ibv_get_cq_event; ibv_ack_cq_events; ibv_create_qp; ibv_modify_qp;
    ibv_destroy_qp; ibv_get_async_event; ibv_ack_async_event; ibv_wc_status_str;
  local: *;
} IBVERBS_1.0;
"##;

/// Builds the fake library; `None` (said why) where it cannot be built here
/// (see [`verbs_h_and_cc`]).
fn build_fake() -> Option<PathBuf> {
    let cc = verbs_h_and_cc()?;
    let dir = std::env::temp_dir().join(format!("oxccl-ibv-fake-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let (src, map, lib) = (dir.join("fake.c"), dir.join("fake.map"), dir.join("libfakeibverbs.so.1"));
    std::fs::write(&src, FAKE_C).unwrap();
    std::fs::write(&map, FAKE_MAP).unwrap();
    let out = Command::new(&cc)
        .args(["-shared", "-fPIC", "-Wall", "-o"])
        .arg(&lib)
        .arg(&src)
        .arg(format!("-Wl,--version-script={}", map.display()))
        .output()
        .expect("run the C compiler");
    assert!(out.status.success(), "the fake libibverbs did not build:\n{}", String::from_utf8_lossy(&out.stderr));
    Some(lib)
}

/// Memory the fake HCA reads and writes.
struct Buf(Vec<u8>);

impl Buf {
    fn addr(&mut self) -> u64 {
        self.0.as_mut_ptr() as u64
    }
}

fn poll_n(cq: &Arc<dyn Cq>, n: usize) -> Vec<Completion> {
    let mut got = Vec::new();
    assert_eq!(cq.poll(&mut got, n + 8).unwrap(), n, "{got:?}");
    for c in &got {
        assert_eq!(c.status, Status::Success, "{c:?}");
    }
    got
}

/// Whether `fd` is readable now (`poll` with a zero timeout).
#[allow(unsafe_code)]
fn readable(fd: std::os::fd::RawFd) -> bool {
    let mut p = libc::pollfd { fd, events: libc::POLLIN, revents: 0 };
    // SAFETY: one valid pollfd; poll only reads the descriptor's state.
    unsafe { libc::poll(&mut p, 1, 0) == 1 }
}

#[test]
#[allow(unsafe_code)] // Device::reg_mr is unsafe: the buffers must outlive their registrations.
fn the_binding_drives_a_fake_libibverbs() {
    let Some(lib) = build_fake() else { return };
    let lib = lib.to_str().unwrap();

    // What the filter excludes, and why.
    let u = open_devices(&HcaFilter::parse("^fake").unwrap(), Some(lib)).err().expect("all excluded");
    assert_eq!(u.kind, UnavailableKind::Filtered, "{u}");
    assert!(u.reason.contains("(fake_0)") && u.reason.contains("OXCCL_IB_HCA=^fake"), "{u}");
    let u = open_devices(&HcaFilter::parse("=fake_0:2").unwrap(), Some(lib)).err().expect("no port 2");
    assert_eq!(u.kind, UnavailableKind::NotUsable, "{u}");
    assert!(u.reason.contains("fake_0: OXCCL_IB_HCA==fake_0:2 admits none of its 1 ports"), "{u}");

    let devs = open_devices(&HcaFilter::parse("fake_0:1").unwrap(), Some(lib)).unwrap();
    assert_eq!(devs.len(), 1);
    let dev = Arc::clone(&devs[0]);
    assert_eq!(dev.name(), "fake_0");
    let ports = dev.ports().unwrap();
    assert_eq!(ports.len(), 1);
    let port = ports[0].clone();
    assert_eq!(
        (port.num, port.state, port.link_layer, port.lid, port.active_mtu),
        (1, PortState::Active, LinkLayer::Ethernet, 0, 5)
    );
    assert_eq!(port.bw, 100e9 / 8.0, "4x EDR");
    let idx: Vec<u8> = port.gids.iter().map(|g| g.index).collect();
    assert_eq!(idx, [0, 2], "the all-zero entry 1 is skipped");
    assert!(port.gids.iter().all(|g| g.kind == GidType::Unknown), "no sysfs for a fake device");
    let gid = choose_gid("fake_0", &port, None).unwrap();
    assert_eq!((gid.index, gid_to_string(&gid.gid).as_str()), (2, "::ffff:10.1.2.3"));
    assert!(dev.async_event().is_none());

    // Sizes the device refuses.
    assert!(matches!(dev.create_cq(0), Err(Error::InvalidArgument(_))));
    assert!(dev.create_cq(5000).err().unwrap().to_string().contains("max_cqe"));
    let cq = dev.create_cq(256).unwrap();
    let caps = QpCaps { max_send_wr: 64, max_recv_wr: 64, max_inline: 0 };
    let big = QpCaps { max_send_wr: 2000, ..caps };
    assert!(dev.create_qp(&cq, big, 1).err().unwrap().to_string().contains("max_qp_wr"));
    assert!(dev.create_qp(&cq, caps, 2).err().unwrap().to_string().contains("port 2"));
    // A CQ of another opened device is refused.
    let other = open_devices(&HcaFilter::default(), Some(lib)).unwrap().remove(0);
    assert!(other.create_qp(&cq, caps, 1).err().unwrap().to_string().contains("not made by this device"));
    drop(other);

    let mut a = dev.create_qp(&cq, caps, 1).unwrap();
    let mut b = dev.create_qp(&cq, caps, 1).unwrap();
    assert_eq!((a.state(), b.state()), (QpState::Init, QpState::Init));
    assert_ne!(a.qpn(), b.qpn());

    const N: usize = 1 << 16;
    let mut src = Buf((0..N).map(|i| (i * 7 + 3) as u8).collect());
    let mut dst = Buf(vec![0u8; N]);
    let mut back = Buf(vec![0u8; N]);
    let mut kept = Buf(vec![0u8; 4096]);
    // SAFETY: the buffers outlive their registrations (deregistered below,
    // or by the device's drop before the buffers go) and are read only
    // after the completions that say the copies landed.
    let (ms, md, mb, mk) = unsafe {
        assert!(dev.reg_mr(src.addr(), 0, Access::LOCAL).is_err(), "0 bytes");
        (
            dev.reg_mr(src.addr(), N, Access::LOCAL).unwrap(),
            dev.reg_mr(dst.addr(), N, Access::ALL).unwrap(),
            dev.reg_mr(back.addr(), N, Access::LOCAL).unwrap(),
            dev.reg_mr(kept.addr(), 4096, Access::REMOTE_WRITE).unwrap(),
        )
    };
    assert_eq!((md.addr, md.len, md.access), (dst.addr(), N as u64, Access::ALL));

    let w = |wr_id: u64, op: Opcode, off: u64, len: u32, signaled: bool| SendWr {
        wr_id,
        op,
        local: ms.addr + off,
        len,
        lkey: ms.lkey,
        remote: md.addr + off,
        rkey: md.rkey,
        signaled,
    };
    assert!(matches!(a.post_send(&[w(0, Opcode::Write, 0, 8, true)]), Err(Error::InvalidUsage(_))), "before RTS");

    let conn = |remote_qpn: u32| Connect {
        remote_qpn,
        remote_psn: 0,
        local_psn: 0,
        remote_lid: 0,
        remote_gid: gid.gid,
        use_gid: true,
        gid_index: gid.index,
        mtu: port.active_mtu,
        timeout: 20,
        retry_cnt: 7,
        rnr_retry: 7,
        min_rnr_timer: 12,
        sl: 3,
        traffic_class: 106,
        max_rd_atomic: 1,
    };
    let (qa, qb) = (a.qpn(), b.qpn());
    assert!(matches!(a.connect(&Connect { mtu: 9, ..conn(qb) }), Err(Error::InvalidArgument(_))));
    let e = a.connect(&Connect { sl: 4, ..conn(qb) }).unwrap_err().to_string();
    assert!(e.contains("RTR") && e.contains("fake_0") && e.contains("Invalid argument"), "the fake refused: {e}");
    assert_eq!(a.state(), QpState::Init);
    a.connect(&conn(qb)).unwrap();
    b.connect(&conn(qa)).unwrap();
    assert_eq!((a.state(), b.state()), (QpState::Rts, QpState::Rts));
    assert!(matches!(a.connect(&conn(qb)), Err(Error::InvalidUsage(_))), "connected twice");

    // WRITE_WITH_IMM, with the channel armed: an event, drained by arm.
    let fd = cq.fd().unwrap();
    cq.arm().unwrap();
    assert!(!readable(fd));
    b.post_recv(&[RecvWr { wr_id: 100 }]).unwrap();
    let imm = 0xdead_beef;
    a.post_send(&[SendWr { remote: md.addr + 128, ..w(1, Opcode::WriteImm(imm), 16, 4096, true) }]).unwrap();
    assert!(readable(fd), "the armed channel has an event");
    cq.arm().unwrap();
    assert!(!readable(fd), "arm drained the event");
    let mut got = poll_n(&cq, 2);
    got.sort_by_key(|c| c.wr_id);
    assert_eq!((got[0].wr_id, got[0].opcode, got[0].qpn, got[0].imm), (1, WcOpcode::Write, qa, None));
    assert_eq!((got[1].wr_id, got[1].opcode, got[1].qpn), (100, WcOpcode::RecvImm, qb));
    assert_eq!((got[1].imm, got[1].byte_len), (Some(imm), 4096));
    assert_eq!(got[1].vendor_err, imm, "the fake saw the immediate big-endian (it reports ntohl of it here)");
    assert_eq!(&dst.0[128..128 + 4096], &src.0[16..16 + 4096]);
    assert!(dst.0[..128].iter().all(|&x| x == 0));

    // READ it back.
    let read = SendWr { local: mb.addr, lkey: mb.lkey, remote: md.addr + 128, ..w(2, Opcode::Read, 0, 4096, true) };
    a.post_send(&[read]).unwrap();
    let got = poll_n(&cq, 1);
    assert_eq!((got[0].wr_id, got[0].opcode), (2, WcOpcode::Read));
    assert_eq!(&back.0[..4096], &src.0[16..16 + 4096]);

    // A list longer than a batch, unsignaled but the last.
    let list: Vec<SendWr> = (0..40u64).map(|i| w(10 + i, Opcode::Write, i * 1024, 1024, i == 39)).collect();
    a.post_send(&list).unwrap();
    assert_eq!(poll_n(&cq, 1)[0].wr_id, 49);
    assert_eq!(&dst.0[..40 * 1024], &src.0[..40 * 1024]);
    // Every work request of a long signaled list completes, in order.
    let list: Vec<SendWr> = (0..70u64).map(|i| w(100 + i, Opcode::Write, i * 512, 512, true)).collect();
    a.post_send(&list).unwrap();
    let ids: Vec<u64> = poll_n(&cq, 70).iter().map(|c| c.wr_id).collect();
    assert_eq!(ids, (100..170).collect::<Vec<_>>());

    // A refused work request in a list: the error says how many were posted.
    let list = [
        w(200, Opcode::Write, 0, 8, false),
        w(201, Opcode::Write, 8, 8, false),
        w(202, Opcode::WriteImm(1), 16, 8, true),
    ];
    let e = a.post_send(&list).unwrap_err().to_string();
    assert!(e.contains("2 of 3 work requests posted") && e.contains(&format!("QP {qa}")), "{e}");
    // A full receive queue.
    let recvs: Vec<RecvWr> = (0..65).map(|i| RecvWr { wr_id: i }).collect();
    let e = b.post_recv(&recvs).unwrap_err().to_string();
    assert!(e.contains("receive queue full") && e.contains("64 of 65 posted"), "{e}");

    // Failing a QP; sends are refused after.
    a.fail().unwrap();
    assert_eq!(a.state(), QpState::Error);
    assert!(matches!(a.post_send(&[w(300, Opcode::Write, 0, 8, true)]), Err(Error::InvalidUsage(_))));

    for m in [ms, md, mb] {
        dev.dereg_mr(&m).unwrap();
    }
    assert!(dev.dereg_mr(&ms).unwrap_err().to_string().contains("not a live registration"));
    // Teardown in any order of the handles: the device's registrations
    // (`mk` is left registered) go before its PD, QPs before their CQ,
    // everything before the context (the fake aborts otherwise).
    let _ = mk;
    drop(devs);
    drop(dev);
    drop(a);
    drop(cq);
    drop(b);
    drop(kept);
}
