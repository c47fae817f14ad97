/* SPDX-License-Identifier: (MIT OR GPL-2.0-only) */
/*
 * The ABI between the sensors and their Rust reader: ring-buffer records and map
 * keys/values. Every struct here is mirrored by a #[repr(C)] struct in
 * src/events.rs or src/maps.rs; both sides assert the sizes, so a field added on one
 * side only fails the build instead of shifting every later field.
 *
 * Layout rules: fixed-width fields only, explicit padding, no implicit holes (map
 * keys are hashed byte for byte, so a hole of stack garbage would split one key in
 * two).
 */
#ifndef SWIFTLET_EVENTS_H
#define SWIFTLET_EVENTS_H

/* Long enough for the deepest kubelet cgroup path (systemd driver, ~190 bytes)
 * with room for runtimes that nest deeper. Longer paths are truncated and flagged. */
#define SWL_PATH_MAX 512
#define SWL_COMM_LEN 16

/* Deepest cgroup level the filter walks. kubepods sits at level 1-3; containers at
 * most ~5 below it. Cgroups deeper than this are matched only against their first
 * SWL_MAX_DEPTH ancestors. */
#define SWL_MAX_DEPTH 32

/* The cgroup2 (default) hierarchy always has hierarchy id 0. */
#define SWL_UNIFIED_HIERARCHY 0

/* Hierarchy ids below this have a level mask in watched_levels; the kernel hands
 * them out from 1 up, so only a node that mounts and unmounts v1 hierarchies over
 * and over goes beyond it (those fall back to checking every level). */
#define SWL_MAX_HIERARCHIES 64

enum swl_event_kind {
	SWL_EVENT_CGROUP_MKDIR = 1,
	SWL_EVENT_CGROUP_RMDIR = 2,
	SWL_EVENT_EXEC = 3,
	SWL_EVENT_EXIT = 4,
	SWL_EVENT_OOM_KILL = 5,
	SWL_EVENT_RECLAIM = 6,
};

/* swl_cgroup_event.flags */
#define SWL_CGROUP_PATH_TRUNCATED (1U << 0)

/* swl_exec_event.flags and swl_exit_event.flags */
#define SWL_TASK_NS_INIT (1U << 0)	/* thread group is pid 1 of its pid namespace */
#define SWL_TASK_FIRST_EXEC (1U << 1)	/* first exec seen in one of its watched cgroups */
#define SWL_TASK_GROUP_DEAD (1U << 2)	/* last thread of the thread group */
#define SWL_TASK_MAIN (1U << 3)		/* the process that made its cgroup's first exec */

enum swl_reclaim_scope {
	SWL_RECLAIM_MEMCG = 1,	/* reclaim because a memory cgroup hit its limit */
	SWL_RECLAIM_DIRECT = 2,	/* global direct reclaim: the node is short of memory */
};

enum swl_reclaim_phase {
	SWL_RECLAIM_BEGIN = 1,
	SWL_RECLAIM_END = 2,
};

struct swl_header {
	__u32 kind;		/* enum swl_event_kind */
	__u32 cpu;		/* CPU the event was recorded on */
	__u64 ktime_ns;		/* bpf_ktime_get_ns(): CLOCK_MONOTONIC */
};

/* A task's identity as the agent needs it: global ids to act on, namespace ids to
 * recognise the container's main process, cgroup ids to find the container. */
struct swl_task {
	__u32 pid;		/* kernel tid (global pid namespace) */
	__u32 tgid;		/* thread group id (global pid namespace) */
	__u32 ns_pid;		/* tid in the task's own pid namespace */
	__u32 ns_tgid;		/* thread group id in the task's own pid namespace */
	__u64 cgroup2_id;	/* cgroup2 cgroup id (= inode of its directory) */
	__u64 memcg_id;		/* v1 memory cgroup id; 0 when memory is not on v1 */
	__u64 cpu_cgroup_id;	/* v1 cpu cgroup id; 0 when cpu is not on v1 */
	__u32 memcg_hierarchy_id;	/* hierarchy of memcg_id; 0 when memcg_id is 0 */
	__u32 cpu_hierarchy_id;	/* hierarchy of cpu_cgroup_id; 0 when it is 0 */
	char comm[SWL_COMM_LEN];
};

struct swl_cgroup_event {
	struct swl_header hdr;
	__u64 cgroup_id;	/* kn->id: inode of the cgroup directory */
	__u32 hierarchy_id;	/* cgrp->root->hierarchy_id (0 = cgroup2) */
	__u32 level;		/* depth below the hierarchy root (root = 0) */
	__u32 flags;		/* SWL_CGROUP_* */
	__u32 path_len;		/* bytes of path, without the NUL */
	char path[SWL_PATH_MAX];	/* path from the hierarchy root, NUL-terminated */
};

struct swl_exec_event {
	struct swl_header hdr;
	struct swl_task task;
	__u32 flags;		/* SWL_TASK_* */
	__u32 _pad;
};

struct swl_exit_event {
	struct swl_header hdr;
	struct swl_task task;
	__u32 flags;		/* SWL_TASK_* */
	__u32 exit_status;	/* wait(2) status: (code << 8) | signal | 0x80 core */
};

struct swl_oom_event {
	struct swl_header hdr;
	struct swl_task task;	/* the victim, not the task that ran out of memory */
	__u32 uid;		/* the victim's uid */
	__u32 _pad;
};

struct swl_reclaim_event {
	struct swl_header hdr;
	struct swl_task task;	/* the task that entered reclaim */
	__u32 scope;		/* enum swl_reclaim_scope */
	__u32 phase;		/* enum swl_reclaim_phase */
	__u32 order;		/* begin: allocation order; end: 0 */
	__u32 gfp_flags;	/* begin: gfp mask; end: 0 */
	__u64 nr_reclaimed;	/* end: pages reclaimed; begin: 0 */
	__u64 duration_ns;	/* end: time since the matching begin; begin: 0 */
};

/* Key of watched_roots and cgroup_counters. v1 cgroup ids are unique only within
 * their hierarchy, so the hierarchy is part of the key. */
struct swl_cgroup_key {
	__u64 cgroup_id;
	__u32 hierarchy_id;
	__u32 _pad;		/* always 0 */
};

struct swl_counters {
	__u64 execs;		/* every exec by a task of the cgroup */
	__u64 exits;		/* every task (thread) exit */
	__u64 group_exits;	/* exits of a whole thread group (processes) */
	__u64 oom_kills;	/* OOM-killer victims in the cgroup */
	__u64 reclaims;		/* reclaim episodes entered by tasks of the cgroup */
	__u64 reclaim_ns;	/* total time of those episodes */
	__u64 last_exit_ktime_ns;	/* 0 = no process has exited yet */
	__u32 last_exit_status;	/* wait(2) status of the last process exit */
	__u32 main_tgid;	/* tgid of the first exec (the container's main process), or
				 * seeded by userspace; 0 = none yet */
};

_Static_assert(sizeof(struct swl_header) == 16, "swl_header size is ABI");
_Static_assert(sizeof(struct swl_task) == 64, "swl_task size is ABI");
_Static_assert(sizeof(struct swl_cgroup_event) == 40 + SWL_PATH_MAX, "swl_cgroup_event size is ABI");
_Static_assert(sizeof(struct swl_exec_event) == 88, "swl_exec_event size is ABI");
_Static_assert(sizeof(struct swl_exit_event) == 88, "swl_exit_event size is ABI");
_Static_assert(sizeof(struct swl_oom_event) == 88, "swl_oom_event size is ABI");
_Static_assert(sizeof(struct swl_reclaim_event) == 112, "swl_reclaim_event size is ABI");
_Static_assert(sizeof(struct swl_cgroup_key) == 16, "swl_cgroup_key size is ABI");
_Static_assert(sizeof(struct swl_counters) == 64, "swl_counters size is ABI");

#endif /* SWIFTLET_EVENTS_H */
