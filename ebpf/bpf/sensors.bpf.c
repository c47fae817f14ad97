// SPDX-License-Identifier: (MIT OR GPL-2.0-only)
/*
 * swiftlet's sensors: cgroup mkdir/rmdir, exec, exit, OOM kill and reclaim, seen
 * from BTF tracepoints (tp_btf; kprobes and fentry are unavailable on the nodes)
 * and reported through one ring buffer.
 *
 * Filter: userspace puts the kubepods root cgroup(s) in watched_roots, keyed by
 * (hierarchy id, cgroup id), and sets bit <level> of watched_levels[hierarchy id]
 * for each. A cgroup event passes when the cgroup or one of its ancestors is a
 * watched root in the cgroup's own hierarchy. A task event passes when the task's
 * cgroup2 cgroup or its v1 memory cgroup does. Only ancestors at levels whose bit
 * is set are looked up, so an unrelated task costs a few direct BTF loads and one
 * or two hash lookups, and writes nothing.
 *
 * Rates: per-cgroup counters count every exec and exit; the ring buffer carries
 * only what the agent acts on (first exec in a cgroup, exec of a pid namespace's
 * init, exits of whole processes), so a container that runs threads or execs in a
 * loop costs counter increments, not records.
 *
 * Wakeups: a wakeup costs the writing task ~10 us here (irq_work + IPI in a VM),
 * most of a record's kernel cost. Records the agent acts on at once force one:
 * cgroup mkdir/rmdir, OOM kills, reported execs, and the exit of a cgroup's main
 * process (its first exec, a pid namespace's init, or the process userspace named
 * for a container older than the sensors). Exits of other processes and
 * reclaim records are written without a wakeup unless the buffer is a quarter full;
 * the reader picks them up with the next wakeup or its periodic flush. Forcing,
 * not the adaptive default, because an adaptive wakeup is skipped whenever an
 * unread no-wakeup record sits in front of it.
 */
#include <stdbool.h>
#include <linux/types.h>
#include <linux/bpf.h>
#include <bpf/bpf_helpers.h>
#include <bpf/bpf_core_read.h>
#include <bpf/bpf_tracing.h>

#include "kernel.h"
#include "events.h"

/* The tracing helpers used here are GPL-only; the dual licence keeps them usable. */
char LICENSE[] SEC("license") = "Dual MIT/GPL";

struct linux_binprm;

/* Every record; userspace sets the size (default 256 KiB) before load. */
struct {
	__uint(type, BPF_MAP_TYPE_RINGBUF);
	__uint(max_entries, 256 * 1024);
} events SEC(".maps");

/* Roots of the subtrees to report on. Value: the root's level (informational). */
struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 64);
	__type(key, struct swl_cgroup_key);
	__type(value, __u32);
} watched_roots SEC(".maps");

/* Per hierarchy id: bit i set when some watched root sits at level i. Lets the
 * filter skip the levels where no root can match. Userspace keeps it in sync. */
struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, SWL_MAX_HIERARCHIES);
	__type(key, __u32);
	__type(value, __u64);
} watched_levels SEC(".maps");

/* Per-cgroup counters for cgroups below watched roots; deleted on rmdir. A node
 * with 110 pods has well under 2000 such cgroups (pod + containers, two
 * hierarchies); preallocated, 16384 entries take ~2 MiB of kernel memory. */
struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 16384);
	__type(key, struct swl_cgroup_key);
	__type(value, struct swl_counters);
} cgroup_counters SEC(".maps");

/* Records lost because the ring buffer was full; userspace sums the CPUs. */
struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, __u64);
} drops SEC(".maps");

/*
 * Start time of an open reclaim episode, keyed by (tid << 2 | scope). LRU so that an
 * episode whose end we never see (program attached mid-episode) cannot leak.
 */
struct {
	__uint(type, BPF_MAP_TYPE_LRU_HASH);
	__uint(max_entries, 4096);
	__type(key, __u64);
	__type(value, __u64);
} reclaim_start SEC(".maps");

/* ---- ring buffer ---------------------------------------------------------- */

static __always_inline void count_drop(void)
{
	__u32 zero = 0;
	__u64 *n = bpf_map_lookup_elem(&drops, &zero);

	/* Atomic although per-CPU: a preempted program can share the CPU slot. */
	if (n)
		__sync_fetch_and_add(n, 1);
}

static __always_inline void *reserve(__u64 size, __u32 kind)
{
	struct swl_header *hdr = bpf_ringbuf_reserve(&events, size, 0);

	if (!hdr) {
		count_drop();
		return NULL;
	}
	hdr->kind = kind;
	hdr->cpu = bpf_get_smp_processor_id();
	hdr->ktime_ns = bpf_ktime_get_ns();
	return hdr;
}

/* Records that can wait ride along with the next wakeup unless the buffer fills up. */
static __always_inline __u64 deferred_wakeup_flags(void)
{
	__u64 avail = bpf_ringbuf_query(&events, BPF_RB_AVAIL_DATA);
	__u64 size = bpf_ringbuf_query(&events, BPF_RB_RING_SIZE);

	return avail >= size / 4 ? BPF_RB_FORCE_WAKEUP : BPF_RB_NO_WAKEUP;
}

/* ---- cgroups --------------------------------------------------------------- */

/*
 * The hot path (every exec/exit on the node) reads through the BTF-typed pointers
 * directly: a verified load is far cheaper than a bpf_probe_read_kernel() call, and
 * a NULL or stale pointer reads as 0 instead of faulting.
 */
static __always_inline __u64 cgroup_id_of(struct cgroup *cg)
{
	return cg->kn->id;
}

/* Is cg, or one of its ancestors, a watched root of hierarchy hierarchy_id? */
static __always_inline bool cgroup_is_watched(struct cgroup *cg, __u32 hierarchy_id)
{
	struct swl_cgroup_key key = { .hierarchy_id = hierarchy_id };
	__u64 levels = ~0ULL;
	int level = cg->level;

	if (hierarchy_id < SWL_MAX_HIERARCHIES) {
		__u64 *mask = bpf_map_lookup_elem(&watched_levels, &hierarchy_id);

		levels = mask ? *mask : 0;
	}
	if (!levels)
		return false;

	/* Not unrolled: the verifier bounds the loop, and 32 copies per caller would
	 * bloat every program. */
#pragma clang loop unroll(disable)
	for (int i = 0; i < SWL_MAX_DEPTH; i++) {
		struct cgroup *ancestor;

		if (i > level)
			break;
		if (!(levels & (1ULL << i)))
			continue;
		/* A helper read: the verifier refuses direct loads from the flexible
		 * ancestors[] array ("struct cgroup doesn't have field at offset"). */
		if (bpf_core_read(&ancestor, sizeof(ancestor), &cg->ancestors[i]) || !ancestor)
			break;
		/* ancestor came from a helper read, so it is a plain number to the
		 * verifier: read through it with helpers too. */
		key.cgroup_id = BPF_CORE_READ(ancestor, kn, id);
		if (bpf_map_lookup_elem(&watched_roots, &key))
			return true;
	}
	return false;
}

/*
 * The cgroup of a v1 controller, or NULL when the controller is absent or lives on
 * the cgroup2 hierarchy (its cgroups then are the task's cgroup2 ancestors).
 */
static __always_inline struct cgroup *v1_cgroup(struct css_set *cset, int subsys_id, __u32 *hierarchy_id)
{
	struct cgroup_subsys_state *css;
	struct cgroup *cg;
	int hier;

	if (subsys_id < 0 || subsys_id >= 16)
		return NULL;
	css = cset->subsys[subsys_id];
	if (!css)
		return NULL;
	cg = css->cgroup;
	if (!cg)
		return NULL;
	hier = cg->root->hierarchy_id;
	if (hier <= SWL_UNIFIED_HIERARCHY)
		return NULL;
	*hierarchy_id = hier;
	return cg;
}

/* A task's cgroups and which of them lie below a watched root. */
struct task_cgroups {
	struct css_set *cset;
	struct cgroup *dfl;
	struct cgroup *memcg;
	__u32 memcg_hierarchy_id;
	bool dfl_watched;
	bool memcg_watched;
};

/* Reads the task's cgroups; true when any of them is below a watched root. */
static __always_inline bool task_is_watched(struct task_struct *task, struct task_cgroups *cgs)
{
	__builtin_memset(cgs, 0, sizeof(*cgs));
	cgs->cset = task->cgroups;
	if (!cgs->cset)
		return false;
	cgs->dfl = cgs->cset->dfl_cgrp;
	if (cgs->dfl)
		cgs->dfl_watched = cgroup_is_watched(cgs->dfl, SWL_UNIFIED_HIERARCHY);
	if (bpf_core_enum_value_exists(enum cgroup_subsys_id, memory_cgrp_id))
		cgs->memcg = v1_cgroup(cgs->cset, bpf_core_enum_value(enum cgroup_subsys_id, memory_cgrp_id),
				       &cgs->memcg_hierarchy_id);
	if (cgs->memcg)
		cgs->memcg_watched = cgroup_is_watched(cgs->memcg, cgs->memcg_hierarchy_id);
	return cgs->dfl_watched || cgs->memcg_watched;
}

/* ---- counters -------------------------------------------------------------- */

static __always_inline struct swl_counters *counters_of(struct cgroup *cg, __u32 hierarchy_id)
{
	struct swl_cgroup_key key = { .cgroup_id = cgroup_id_of(cg), .hierarchy_id = hierarchy_id };
	struct swl_counters *c = bpf_map_lookup_elem(&cgroup_counters, &key);

	if (c)
		return c;
	struct swl_counters zero = {};
	/* NOEXIST: a racing CPU may have created it; either way look it up again. */
	bpf_map_update_elem(&cgroup_counters, &key, &zero, BPF_NOEXIST);
	return bpf_map_lookup_elem(&cgroup_counters, &key);
}

/* The counters of each watched cgroup of the task; slot 0 cgroup2, slot 1 memcg. */
static __always_inline struct swl_counters *task_counters(struct task_cgroups *cgs, int slot)
{
	if (slot == 0)
		return cgs->dfl_watched ? counters_of(cgs->dfl, SWL_UNIFIED_HIERARCHY) : NULL;
	return cgs->memcg_watched ? counters_of(cgs->memcg, cgs->memcg_hierarchy_id) : NULL;
}

/* ---- tasks ----------------------------------------------------------------- */

/* The number of a struct pid in the pid namespace it was allocated in (its deepest). */
static __always_inline __u32 pid_nr_in_own_ns(struct pid *pid)
{
	unsigned int level;
	int nr = 0;

	if (!pid)
		return 0;
	level = pid->level;
	/* MAX_PID_NS_LEVEL is 32. */
	if (level > 32)
		return 0;
	/* numbers[level].nr, with the kernel's struct upid size, not ours; a helper
	 * read because the verifier allows no variable offset into a BTF pointer. */
	bpf_core_read(&nr, sizeof(nr),
		      (const char *)&pid->numbers + level * bpf_core_type_size(struct upid) +
			      bpf_core_field_offset(struct upid, nr));
	return nr;
}

/*
 * The inode number of the agent's pid namespace when that is not the initial one (an
 * agent in a node container, as kind runs its kubelets); 0 when it is. Set at load.
 * A cgroup's main_tgid is the process id the agent sees (the one it reads in
 * cgroup.procs and /proc when it adopts a running container), so in a pid namespace
 * the sensors compare the task's number there, not its init-namespace tgid.
 */
const volatile __u32 agent_pidns_inum = 0;

/* A thread group's id as the agent sees it: its number in the agent's pid namespace
 * (0 when the task is not in it or a descendant of it). */
static __always_inline __u32 tgid_seen_by_agent(struct task_struct *task)
{
	struct pid *pid;
	unsigned int level;

	if (!agent_pidns_inum)
		return task->tgid;
	pid = task->group_leader->thread_pid;
	if (!pid)
		return 0;
	level = pid->level;
	for (unsigned int i = 0; i <= 32; i++) {
		struct pid_namespace *ns = NULL;
		const char *upid;
		unsigned int inum = 0;
		int nr = 0;

		if (i > level)
			break;
		upid = (const char *)&pid->numbers + i * bpf_core_type_size(struct upid);
		bpf_core_read(&ns, sizeof(ns), upid + bpf_core_field_offset(struct upid, ns));
		if (!ns || bpf_core_read(&inum, sizeof(inum), &ns->ns.inum) || inum != agent_pidns_inum)
			continue;
		bpf_core_read(&nr, sizeof(nr), upid + bpf_core_field_offset(struct upid, nr));
		return nr;
	}
	return 0;
}

static __always_inline void fill_task(struct swl_task *t, struct task_struct *task, struct task_cgroups *cgs)
{
	struct cgroup *cpu = NULL;
	__u32 cpu_hierarchy_id = 0;

	t->pid = task->pid;
	t->tgid = task->tgid;
	t->ns_pid = pid_nr_in_own_ns(task->thread_pid);
	t->ns_tgid = pid_nr_in_own_ns(task->group_leader->thread_pid);

	/* Only reported, never filtered on: read here, for records only. */
	if (cgs->cset && bpf_core_enum_value_exists(enum cgroup_subsys_id, cpu_cgrp_id))
		cpu = v1_cgroup(cgs->cset, bpf_core_enum_value(enum cgroup_subsys_id, cpu_cgrp_id), &cpu_hierarchy_id);

	t->cgroup2_id = cgs->dfl ? cgroup_id_of(cgs->dfl) : 0;
	t->memcg_id = cgs->memcg ? cgroup_id_of(cgs->memcg) : 0;
	t->cpu_cgroup_id = cpu ? cgroup_id_of(cpu) : 0;
	t->memcg_hierarchy_id = cgs->memcg ? cgs->memcg_hierarchy_id : 0;
	t->cpu_hierarchy_id = cpu ? cpu_hierarchy_id : 0;
	if (bpf_core_read(&t->comm, sizeof(t->comm), &task->comm))
		__builtin_memset(&t->comm, 0, sizeof(t->comm));
}

/* The container's main process: its thread group is pid 1 of its pid namespace. */
static __always_inline bool is_ns_init(struct task_struct *task)
{
	return pid_nr_in_own_ns(task->group_leader->thread_pid) == 1;
}

/* ---- cgroup mkdir / rmdir ---------------------------------------------------- */

static __always_inline int on_cgroup_event(__u32 kind, struct cgroup *cgrp, const char *path)
{
	__u32 hierarchy_id = cgrp->root->hierarchy_id;
	struct swl_cgroup_event *e;
	long n;

	if (!cgroup_is_watched(cgrp, hierarchy_id))
		return 0;

	if (kind == SWL_EVENT_CGROUP_RMDIR) {
		struct swl_cgroup_key key = { .cgroup_id = cgroup_id_of(cgrp), .hierarchy_id = hierarchy_id };

		/* Dead cgroups keep no state: their ids are never reused while the
		 * kernfs node lives, and the agent reads counters before removing. */
		bpf_map_delete_elem(&cgroup_counters, &key);
		bpf_map_delete_elem(&watched_roots, &key);
	}

	e = reserve(sizeof(*e), kind);
	if (!e)
		return 0;
	e->cgroup_id = cgroup_id_of(cgrp);
	e->hierarchy_id = hierarchy_id;
	e->level = cgrp->level;
	e->flags = 0;
	n = bpf_probe_read_kernel_str(e->path, sizeof(e->path), path);
	if (n <= 0) {
		e->path[0] = '\0';
		e->path_len = 0;
	} else {
		e->path_len = n - 1;
		/* A full buffer may mean the kernel's path was longer. */
		if (n == sizeof(e->path))
			e->flags |= SWL_CGROUP_PATH_TRUNCATED;
	}
	bpf_ringbuf_submit(e, BPF_RB_FORCE_WAKEUP);
	return 0;
}

SEC("tp_btf/cgroup_mkdir")
int BPF_PROG(on_cgroup_mkdir, struct cgroup *cgrp, const char *path)
{
	return on_cgroup_event(SWL_EVENT_CGROUP_MKDIR, cgrp, path);
}

SEC("tp_btf/cgroup_rmdir")
int BPF_PROG(on_cgroup_rmdir, struct cgroup *cgrp, const char *path)
{
	return on_cgroup_event(SWL_EVENT_CGROUP_RMDIR, cgrp, path);
}

/* ---- exec / exit ------------------------------------------------------------- */

SEC("tp_btf/sched_process_exec")
int BPF_PROG(on_exec, struct task_struct *p, int old_pid, struct linux_binprm *bprm)
{
	struct task_cgroups cgs;
	struct swl_exec_event *e;
	__u32 flags = 0;
	__u32 tgid;

	if (!task_is_watched(p, &cgs))
		return 0;

	/* Once for both slots: in a pid namespace it walks the task's pid levels. */
	tgid = tgid_seen_by_agent(p);
	for (int slot = 0; slot < 2; slot++) {
		struct swl_counters *c = task_counters(&cgs, slot);

		if (!(slot == 0 ? cgs.dfl_watched : cgs.memcg_watched))
			continue;
		/* Watched but no counters (map full): the exec cannot be known not to
		 * be the first, so report it. */
		if (!c) {
			flags |= SWL_TASK_FIRST_EXEC;
			continue;
		}
		__sync_fetch_and_add(&c->execs, 1);
		/* The runtime's init execs the container's process first. Userspace
		 * seeds main_tgid for containers that started before the sensors. */
		if (__sync_val_compare_and_swap(&c->main_tgid, 0, tgid) == 0)
			flags |= SWL_TASK_FIRST_EXEC;
	}
	if (is_ns_init(p))
		flags |= SWL_TASK_NS_INIT;
	/* Later execs (probes, kubectl exec, shells) only count. */
	if (!flags)
		return 0;

	e = reserve(sizeof(*e), SWL_EVENT_EXEC);
	if (!e)
		return 0;
	fill_task(&e->task, p, &cgs);
	e->flags = flags;
	e->_pad = 0;
	bpf_ringbuf_submit(e, BPF_RB_FORCE_WAKEUP);
	return 0;
}

SEC("tp_btf/sched_process_exit")
int BPF_PROG(on_exit, struct task_struct *p, bool group_dead)
{
	struct task_cgroups cgs;
	struct swl_exit_event *e;
	__u32 flags = 0;
	__u32 status;
	__u32 tgid = 0;
	__u64 now;

	if (!task_is_watched(p, &cgs))
		return 0;

	/*
	 * What wait(2) will report: once the group is dead, the group exit code (set
	 * by exit_group, a fatal signal, or the last thread's exit), not the exit code
	 * of whichever thread happened to die last.
	 */
	status = p->exit_code;
	if (group_dead && (p->signal->flags & SIGNAL_GROUP_EXIT))
		status = p->signal->group_exit_code;

	now = bpf_ktime_get_ns();
	/* Once for both slots, and only for a group's end: only that can be a main exit. */
	if (group_dead)
		tgid = tgid_seen_by_agent(p);
	for (int slot = 0; slot < 2; slot++) {
		struct swl_counters *c = task_counters(&cgs, slot);

		if (!c)
			continue;
		__sync_fetch_and_add(&c->exits, 1);
		if (group_dead) {
			__sync_fetch_and_add(&c->group_exits, 1);
			c->last_exit_status = status;
			c->last_exit_ktime_ns = now;
			if (c->main_tgid && c->main_tgid == tgid)
				flags |= SWL_TASK_MAIN;
		}
	}
	/* Threads leaving a live process are not lifecycle events. */
	if (!group_dead)
		return 0;
	if (is_ns_init(p))
		flags |= SWL_TASK_NS_INIT;

	e = reserve(sizeof(*e), SWL_EVENT_EXIT);
	if (!e)
		return 0;
	fill_task(&e->task, p, &cgs);
	e->flags = flags | SWL_TASK_GROUP_DEAD;
	e->exit_status = status;
	/* The container's main process ending is what the PLEG waits for. */
	bpf_ringbuf_submit(e, flags & (SWL_TASK_MAIN | SWL_TASK_NS_INIT) ? BPF_RB_FORCE_WAKEUP
									: deferred_wakeup_flags());
	return 0;
}

/* ---- OOM kill ------------------------------------------------------------------ */

SEC("tp_btf/mark_victim")
int BPF_PROG(on_mark_victim, struct task_struct *victim, __u32 uid)
{
	struct task_cgroups cgs;
	struct swl_oom_event *e;

	/* The victim's cgroups: the current task is whoever ran out of memory. */
	if (!task_is_watched(victim, &cgs))
		return 0;

	for (int slot = 0; slot < 2; slot++) {
		struct swl_counters *c = task_counters(&cgs, slot);

		if (c)
			__sync_fetch_and_add(&c->oom_kills, 1);
	}

	e = reserve(sizeof(*e), SWL_EVENT_OOM_KILL);
	if (!e)
		return 0;
	fill_task(&e->task, victim, &cgs);
	e->uid = uid;
	e->_pad = 0;
	bpf_ringbuf_submit(e, BPF_RB_FORCE_WAKEUP);
	return 0;
}

/* ---- reclaim --------------------------------------------------------------- */

static __always_inline __u64 reclaim_key(struct task_struct *task, __u32 scope)
{
	return ((__u64)(__u32)task->pid << 2) | scope;
}

static __always_inline int on_reclaim_begin(__u32 scope, int order, __u32 gfp_flags)
{
	struct task_struct *task = bpf_get_current_task_btf();
	struct task_cgroups cgs;
	struct swl_reclaim_event *e;
	__u64 key, now;

	if (!task_is_watched(task, &cgs))
		return 0;

	key = reclaim_key(task, scope);
	now = bpf_ktime_get_ns();
	bpf_map_update_elem(&reclaim_start, &key, &now, BPF_ANY);

	e = reserve(sizeof(*e), SWL_EVENT_RECLAIM);
	if (!e)
		return 0;
	fill_task(&e->task, task, &cgs);
	e->scope = scope;
	e->phase = SWL_RECLAIM_BEGIN;
	e->order = order;
	e->gfp_flags = gfp_flags;
	e->nr_reclaimed = 0;
	e->duration_ns = 0;
	bpf_ringbuf_submit(e, deferred_wakeup_flags());
	return 0;
}

static __always_inline int on_reclaim_end(__u32 scope, __u64 nr_reclaimed)
{
	struct task_struct *task = bpf_get_current_task_btf();
	struct task_cgroups cgs;
	struct swl_reclaim_event *e;
	__u64 key = reclaim_key(task, scope);
	__u64 *start, duration;

	/* Only episodes whose begin passed the filter have a start: unrelated
	 * tasks pay one lookup here. */
	start = bpf_map_lookup_elem(&reclaim_start, &key);
	if (!start)
		return 0;
	duration = bpf_ktime_get_ns() - *start;
	bpf_map_delete_elem(&reclaim_start, &key);

	/* Reclaim does not migrate tasks, but the cgroups are re-read for the record. */
	if (!task_is_watched(task, &cgs))
		return 0;
	for (int slot = 0; slot < 2; slot++) {
		struct swl_counters *c = task_counters(&cgs, slot);

		if (!c)
			continue;
		__sync_fetch_and_add(&c->reclaims, 1);
		__sync_fetch_and_add(&c->reclaim_ns, duration);
	}

	e = reserve(sizeof(*e), SWL_EVENT_RECLAIM);
	if (!e)
		return 0;
	fill_task(&e->task, task, &cgs);
	e->scope = scope;
	e->phase = SWL_RECLAIM_END;
	e->order = 0;
	e->gfp_flags = 0;
	e->nr_reclaimed = nr_reclaimed;
	e->duration_ns = duration;
	bpf_ringbuf_submit(e, deferred_wakeup_flags());
	return 0;
}

SEC("tp_btf/mm_vmscan_memcg_reclaim_begin")
int BPF_PROG(on_memcg_reclaim_begin, int order, __u32 gfp_flags)
{
	return on_reclaim_begin(SWL_RECLAIM_MEMCG, order, gfp_flags);
}

SEC("tp_btf/mm_vmscan_memcg_reclaim_end")
int BPF_PROG(on_memcg_reclaim_end, unsigned long nr_reclaimed)
{
	return on_reclaim_end(SWL_RECLAIM_MEMCG, nr_reclaimed);
}

SEC("tp_btf/mm_vmscan_direct_reclaim_begin")
int BPF_PROG(on_direct_reclaim_begin, int order, __u32 gfp_flags)
{
	return on_reclaim_begin(SWL_RECLAIM_DIRECT, order, gfp_flags);
}

SEC("tp_btf/mm_vmscan_direct_reclaim_end")
int BPF_PROG(on_direct_reclaim_end, unsigned long nr_reclaimed)
{
	return on_reclaim_end(SWL_RECLAIM_DIRECT, nr_reclaimed);
}
