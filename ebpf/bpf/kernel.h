/* SPDX-License-Identifier: (MIT OR GPL-2.0-only) */
/*
 * CO-RE views of the few kernel types the sensors read, instead of a generated
 * vmlinux.h: the build then needs no BTF of the build host, and the loader
 * relocates every field below against /sys/kernel/btf/vmlinux of the node. Only
 * names matter: each struct lists just the fields read, in any order, and the
 * relocations fix offsets and sizes at load time.
 */
#ifndef SWIFTLET_KERNEL_H
#define SWIFTLET_KERNEL_H

#define __swl_core __attribute__((preserve_access_index))

struct kernfs_node {
	__u64 id;
} __swl_core;

struct cgroup_root {
	int hierarchy_id;
} __swl_core;

struct cgroup {
	int level;
	struct kernfs_node *kn;
	struct cgroup_root *root;
	struct cgroup *ancestors[];
} __swl_core;

struct cgroup_subsys_state {
	struct cgroup *cgroup;
} __swl_core;

struct css_set {
	/* Indexed by enum cgroup_subsys_id, whose values depend on the kernel config;
	 * the bound is ours (the kernel's is CGROUP_SUBSYS_COUNT, 12 on 6.18). */
	struct cgroup_subsys_state *subsys[16];
	struct cgroup *dfl_cgrp;
} __swl_core;

/* Values are placeholders: bpf_core_enum_value() relocates them to the node's. */
enum cgroup_subsys_id {
	cpu_cgrp_id = 1,
	memory_cgrp_id = 4,
};

struct ns_common {
	unsigned int inum;
} __swl_core;

struct pid_namespace {
	struct ns_common ns;
} __swl_core;

struct upid {
	int nr;
	struct pid_namespace *ns;
} __swl_core;

struct pid {
	unsigned int level;
	struct upid numbers[];
} __swl_core;

struct signal_struct {
	int group_exit_code;
	unsigned int flags;
} __swl_core;

/* include/linux/sched/signal.h; unchanged since 2.6. */
#define SIGNAL_GROUP_EXIT 0x00000004

struct task_struct {
	int pid;
	int tgid;
	int exit_code;
	char comm[16];
	struct task_struct *group_leader;
	struct pid *thread_pid;
	struct signal_struct *signal;
	struct css_set *cgroups;
} __swl_core;

#endif /* SWIFTLET_KERNEL_H */
