// shim.h: small C helpers for the verbs provider. libibverbs' data-path
// calls are static inline functions dispatching through the context's
// operation table, and several fields the provider needs sit in unnamed
// unions that cgo cannot name; these wrappers give Go one plain function
// per operation. Nothing here allocates or keeps state.
#ifndef BLK_VERBS_SHIM_H
#define BLK_VERBS_SHIM_H

#include <errno.h>
#include <fcntl.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <infiniband/verbs.h>
#include <rdma/rdma_cma.h>

static inline int blk_set_nonblock(int fd) {
	int f = fcntl(fd, F_GETFL);
	if (f < 0)
		return errno;
	if (fcntl(fd, F_SETFL, f | O_NONBLOCK) < 0)
		return errno;
	return 0;
}

// Post calls return 0 or an errno value; *nposted is how many WRs of the
// chain went to the queue before the first one refused.
static inline int blk_post_send(struct ibv_qp *qp, struct ibv_send_wr *wr, int *nposted) {
	struct ibv_send_wr *bad = NULL;
	int rc = ibv_post_send(qp, wr, &bad);
	int n = 0;
	if (rc) {
		for (struct ibv_send_wr *w = wr; w && w != bad; w = w->next)
			n++;
	}
	*nposted = n;
	return rc;
}

static inline int blk_post_recv(struct ibv_qp *qp, struct ibv_recv_wr *wr) {
	struct ibv_recv_wr *bad = NULL;
	return ibv_post_recv(qp, wr, &bad);
}

static inline int blk_post_srq_recv(struct ibv_srq *srq, struct ibv_recv_wr *wr) {
	struct ibv_recv_wr *bad = NULL;
	return ibv_post_srq_recv(srq, wr, &bad);
}

static inline int blk_poll_cq(struct ibv_cq *cq, int n, struct ibv_wc *wc) {
	return ibv_poll_cq(cq, n, wc);
}

static inline int blk_req_notify_cq(struct ibv_cq *cq, int solicited_only) {
	return ibv_req_notify_cq(cq, solicited_only);
}

// blk_get_cq_events takes every pending event of a non-blocking completion
// channel, acknowledges them, and returns how many there were.
static inline int blk_get_cq_events(struct ibv_comp_channel *ch) {
	int n = 0;
	for (;;) {
		struct ibv_cq *cq;
		void *ctx;
		if (ibv_get_cq_event(ch, &cq, &ctx))
			break;
		ibv_ack_cq_events(cq, 1);
		n++;
	}
	return n;
}

static inline void blk_wr_rdma(struct ibv_send_wr *wr, uint64_t addr, uint32_t rkey) {
	wr->wr.rdma.remote_addr = addr;
	wr->wr.rdma.rkey = rkey;
}

static inline void blk_wr_invalidate(struct ibv_send_wr *wr, uint32_t rkey) {
	wr->invalidate_rkey = rkey;
}

static inline uint32_t blk_wc_invalidated_rkey(struct ibv_wc *wc) {
	return wc->invalidated_rkey;
}

static inline int blk_modify_cq(struct ibv_cq *cq, uint16_t count, uint16_t period) {
	struct ibv_modify_cq_attr attr;
	memset(&attr, 0, sizeof attr);
	attr.attr_mask = IBV_CQ_ATTR_MODERATE;
	attr.moderate.cq_count = count;
	attr.moderate.cq_period = period;
	return ibv_modify_cq(cq, &attr);
}

static inline int blk_query_device(struct ibv_context *ctx, struct ibv_device_attr_ex *attr) {
	return ibv_query_device_ex(ctx, NULL, attr);
}

static inline int blk_query_port(struct ibv_context *ctx, uint8_t port, struct ibv_port_attr *attr) {
	return ibv_query_port(ctx, port, attr);
}

// Async events: the element is a union; these name its parts.
static inline uint32_t blk_async_qp_num(struct ibv_async_event *ev) {
	return ev->element.qp ? ev->element.qp->qp_num : 0;
}
static inline uintptr_t blk_async_srq(struct ibv_async_event *ev) { return (uintptr_t)ev->element.srq; }
static inline uintptr_t blk_async_cq(struct ibv_async_event *ev) { return (uintptr_t)ev->element.cq; }

// blk_get_async_event returns 0 and fills *ev (acknowledged already: the
// provider copies what it needs before calling this again), or an errno.
static inline int blk_get_async_event(struct ibv_context *ctx, int *type, uint32_t *qpn, uintptr_t *srq, uintptr_t *cq) {
	struct ibv_async_event ev;
	if (ibv_get_async_event(ctx, &ev))
		return errno;
	*type = ev.event_type;
	*qpn = 0;
	*srq = 0;
	*cq = 0;
	switch (ev.event_type) {
	case IBV_EVENT_CQ_ERR:
		*cq = blk_async_cq(&ev);
		break;
	case IBV_EVENT_SRQ_ERR:
	case IBV_EVENT_SRQ_LIMIT_REACHED:
		*srq = blk_async_srq(&ev);
		break;
	case IBV_EVENT_QP_FATAL:
	case IBV_EVENT_QP_REQ_ERR:
	case IBV_EVENT_QP_ACCESS_ERR:
	case IBV_EVENT_COMM_EST:
	case IBV_EVENT_SQ_DRAINED:
	case IBV_EVENT_PATH_MIG:
	case IBV_EVENT_PATH_MIG_ERR:
	case IBV_EVENT_QP_LAST_WQE_REACHED:
		*qpn = blk_async_qp_num(&ev);
		break;
	default:
		break;
	}
	ibv_ack_async_event(&ev);
	return 0;
}

// blk_sockaddr fills *ss with an IPv4 (len 4) or IPv6 (len 16) address.
static inline void blk_sockaddr(struct sockaddr_storage *ss, const uint8_t *ip, int len, uint16_t port) {
	memset(ss, 0, sizeof *ss);
	if (len == 4) {
		struct sockaddr_in *s = (struct sockaddr_in *)ss;
		s->sin_family = AF_INET;
		s->sin_port = htons(port);
		memcpy(&s->sin_addr, ip, 4);
	} else {
		struct sockaddr_in6 *s = (struct sockaddr_in6 *)ss;
		s->sin6_family = AF_INET6;
		s->sin6_port = htons(port);
		memcpy(&s->sin6_addr, ip, 16);
	}
}

// blk_sockaddr_parse copies the address of sa into ip (16 bytes) and
// returns its length (4, 16, or 0 if sa is not IP); *port is host order.
static inline int blk_sockaddr_parse(struct sockaddr *sa, uint8_t *ip, uint16_t *port) {
	if (!sa)
		return 0;
	if (sa->sa_family == AF_INET) {
		struct sockaddr_in *s = (struct sockaddr_in *)sa;
		memcpy(ip, &s->sin_addr, 4);
		*port = ntohs(s->sin_port);
		return 4;
	}
	if (sa->sa_family == AF_INET6) {
		struct sockaddr_in6 *s = (struct sockaddr_in6 *)sa;
		memcpy(ip, &s->sin6_addr, 16);
		*port = ntohs(s->sin6_port);
		return 16;
	}
	return 0;
}

// A copy of one rdma_cm event, taken before it is acknowledged.
struct blk_cm_event {
	struct rdma_cm_id *id;
	struct rdma_cm_id *listen_id;
	int event;
	int status;
	uint8_t responder_resources;
	uint8_t initiator_depth;
	uint8_t private_data_len;
	uint8_t private_data[256];
};

// blk_get_cm_event copies the next event of a non-blocking channel into
// *out and acknowledges it; it returns 0, or an errno (EAGAIN: none).
static inline int blk_get_cm_event(struct rdma_event_channel *ch, struct blk_cm_event *out) {
	struct rdma_cm_event *ev;
	if (rdma_get_cm_event(ch, &ev))
		return errno;
	out->id = ev->id;
	out->listen_id = ev->listen_id;
	out->event = ev->event;
	out->status = ev->status;
	out->responder_resources = ev->param.conn.responder_resources;
	out->initiator_depth = ev->param.conn.initiator_depth;
	out->private_data_len = 0;
	if (ev->param.conn.private_data && ev->param.conn.private_data_len) {
		out->private_data_len = ev->param.conn.private_data_len;
		memcpy(out->private_data, ev->param.conn.private_data, ev->param.conn.private_data_len);
	}
	rdma_ack_cm_event(ev);
	return 0;
}

static inline const char *blk_id_device_name(struct rdma_cm_id *id) {
	if (!id || !id->verbs || !id->verbs->device)
		return NULL;
	return id->verbs->device->name;
}

// blk_modify_qp_cm moves qp to state with the attributes rdma_cm computes
// for id; rd_atomic (if >= 0) overrides the RTR responder resources or the
// RTS initiator depth, rnr_retry (if >= 0) the RTS RNR retry count.
static inline int blk_modify_qp_cm(struct rdma_cm_id *id, struct ibv_qp *qp, int state, int rd_atomic, int rnr_retry) {
	struct ibv_qp_attr attr;
	int mask = 0;
	memset(&attr, 0, sizeof attr);
	attr.qp_state = state;
	if (rdma_init_qp_attr(id, &attr, &mask))
		return errno;
	if (state == IBV_QPS_RTR && rd_atomic >= 0)
		attr.max_dest_rd_atomic = rd_atomic;
	if (state == IBV_QPS_RTS && rd_atomic >= 0)
		attr.max_rd_atomic = rd_atomic;
	if (state == IBV_QPS_RTS && rnr_retry >= 0) {
		attr.rnr_retry = rnr_retry;
		mask |= IBV_QP_RNR_RETRY;
	}
	return ibv_modify_qp(qp, &attr, mask);
}

static inline int blk_modify_qp_init(struct ibv_qp *qp, uint8_t port) {
	struct ibv_qp_attr attr;
	memset(&attr, 0, sizeof attr);
	attr.qp_state = IBV_QPS_INIT;
	attr.pkey_index = 0;
	attr.port_num = port;
	attr.qp_access_flags = IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_READ | IBV_ACCESS_REMOTE_WRITE;
	return ibv_modify_qp(qp, &attr, IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_ACCESS_FLAGS);
}

static inline int blk_modify_qp_err(struct ibv_qp *qp) {
	struct ibv_qp_attr attr;
	memset(&attr, 0, sizeof attr);
	attr.qp_state = IBV_QPS_ERR;
	return ibv_modify_qp(qp, &attr, IBV_QP_STATE);
}

static inline int blk_modify_srq(struct ibv_srq *srq, uint32_t max_wr, uint32_t limit, int mask) {
	struct ibv_srq_attr attr;
	memset(&attr, 0, sizeof attr);
	attr.max_wr = max_wr;
	attr.srq_limit = limit;
	return ibv_modify_srq(srq, &attr, mask);
}

static inline int blk_connect(struct rdma_cm_id *id, const void *pd, uint8_t pdlen, uint8_t rr, uint8_t depth, uint8_t rnr, int srq, uint32_t qpn) {
	struct rdma_conn_param p;
	memset(&p, 0, sizeof p);
	p.private_data = pdlen ? pd : NULL;
	p.private_data_len = pdlen;
	p.responder_resources = rr;
	p.initiator_depth = depth;
	p.retry_count = 7;
	p.rnr_retry_count = rnr;
	p.srq = srq;
	p.qp_num = qpn;
	return rdma_connect(id, &p) ? errno : 0;
}

static inline int blk_accept(struct rdma_cm_id *id, const void *pd, uint8_t pdlen, uint8_t rr, uint8_t depth, uint8_t rnr, int srq, uint32_t qpn) {
	struct rdma_conn_param p;
	memset(&p, 0, sizeof p);
	p.private_data = pdlen ? pd : NULL;
	p.private_data_len = pdlen;
	p.responder_resources = rr;
	p.initiator_depth = depth;
	p.rnr_retry_count = rnr;
	p.srq = srq;
	p.qp_num = qpn;
	return rdma_accept(id, &p) ? errno : 0;
}

static inline struct ibv_mr *blk_reg_mr(struct ibv_pd *pd, void *addr, size_t len, int access) {
	return ibv_reg_mr(pd, addr, len, access);
}

static inline struct sockaddr *blk_local_addr(struct rdma_cm_id *id) { return rdma_get_local_addr(id); }
static inline struct sockaddr *blk_peer_addr(struct rdma_cm_id *id) { return rdma_get_peer_addr(id); }

static inline int blk_errno(void) { return errno; }

#endif
