/*
 * sandrl-helper: the native half of the bubblewrap sandbox backend.
 *
 * One static binary, two roles:
 *
 *   sandrl-helper launch ...   runs on the host as root. It joins the sandbox's cgroups,
 *       makes the sandbox's user namespace (sandbox root = an unprivileged host uid range),
 *       builds the copy-on-write root in a *private* mount namespace (idmapped read-only
 *       image layers + overlayfs over a size-limited tmpfs), drops to the sandbox's host uid
 *       and makes pid 1 itself in the pid/ipc/uts/cgroup namespaces, with /proc and /dev as
 *       bubblewrap makes them, and runs the agent as pid 1 (see "pid 1 made by the helper"
 *       below): a full launch (--sock-fd) with every argument on its command line, a launch
 *       made ahead (--args-fd) with the image's part over its socket when it is taken. Every
 *       mount lives only in namespaces the sandbox owns, so nothing is left on the host
 *       whatever happens to the processes. With --bwrap (a host that needs bubblewrap: the
 *       provider's launcher="bubblewrap") it execs bubblewrap instead, which does the same.
 *
 *   sandrl-helper agent ...    runs inside the sandbox as its pid 1, root of the outer user
 *       namespace; it makes the nested one the sandbox's commands run in (as its root, with
 *       Docker's capabilities and a seccomp filter), where pid 1's own uid is not mapped. It serves requests
 *       from the provider over one socket (run a command, stream its output, stdin,
 *       signals, read/write files, TTL), reaps orphans, enforces per-command timeouts by
 *       killing the whole process tree, and caps output. When the provider's end of the
 *       socket closes (close(), or the provider died) it exits, and the kernel kills
 *       everything else in the pid namespace.
 *
 * Wire format (both directions): u32 payload length, u8 type, u32 request id, payload;
 * little-endian. See sandrl/sandbox/bwrap/protocol.py, which must match this file.
 */
#define _GNU_SOURCE
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <grp.h>
#include <limits.h>
#include <poll.h>
#include <sched.h>
#include <signal.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mount.h>
#include <sys/prctl.h>
#include <sys/signalfd.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>
#include <linux/audit.h>
#include <linux/capability.h>
#include <linux/filter.h>
#include <linux/keyctl.h>
#include <linux/magic.h>
#include <linux/seccomp.h>
#include <net/if.h>
#include <stddef.h>
#include <sys/fsuid.h>
#include <sys/ioctl.h>
#include <sys/statfs.h>

#define PROTOCOL_VERSION 3

/* ---------------------------------------------------------------- utilities */

static void die(const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    fputs("sandrl-helper: ", stderr);
    vfprintf(stderr, fmt, ap);
    if (errno) fprintf(stderr, ": %s", strerror(errno));
    fputc('\n', stderr);
    va_end(ap);
    _exit(70);
}

static int64_t now_ms(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

static int64_t now_us(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000000 + ts.tv_nsec / 1000;
}

/* --times: the launch's steps, timestamped (CLOCK_MONOTONIC, as Python's time.monotonic) on its
 * log, for `sandrl bench sandbox`'s split of a cold create (bench/cold_split.py); pid 1 inherits it. */
static int launch_times;

static void mark(const char *step, int64_t us) {
    if (launch_times) dprintf(2, "sandrl-times %s %lld\n", step, (long long)us);
}

static void write_file_or_die(const char *path, const char *data) {
    int fd = open(path, O_WRONLY | O_CLOEXEC);
    if (fd < 0) die("open %s", path);
    size_t n = strlen(data);
    if (write(fd, data, n) != (ssize_t)n) die("write %s", path);
    close(fd);
}

static void mkdir_or_die(const char *path, mode_t mode, uid_t uid) {
    if (mkdir(path, mode) != 0 && errno != EEXIST) die("mkdir %s", path);
    if (chmod(path, mode) != 0) die("chmod %s", path);
    if (uid != (uid_t)-1 && chown(path, uid, uid) != 0) die("chown %s", path);
}

/* An empty file readable by all: what a masked /proc entry shows (not /dev/null, a device the
 * sandbox's nodev mounts would refuse to open), or where a device node is bound. */
static void create_empty_or_die(const char *path) {
    int fd = open(path, O_WRONLY | O_CREAT | O_CLOEXEC, 0444);
    if (fd < 0 || fchmod(fd, 0444)) die("creating %s", path);
    close(fd);
}

static void drop_to_uid(uid_t uid) {
    if (setgroups(0, NULL) || setresgid(uid, uid, uid) || setresuid(uid, uid, uid)) die("dropping to uid %u", uid);
}

/* As the sandbox's host uid, with a session keyring of its own (as runc gives each container):
 * otherwise it would share the provider's, and through it the host's keys and every other sandbox. */
static void become_sandbox_uid(uid_t uid) {
    drop_to_uid(uid);
    if (syscall(SYS_keyctl, KEYCTL_JOIN_SESSION_KEYRING, NULL) < 0) die("joining a new session keyring");
}

static void put_u32(unsigned char *p, uint32_t v) {
    p[0] = (unsigned char)v;
    p[1] = (unsigned char)(v >> 8);
    p[2] = (unsigned char)(v >> 16);
    p[3] = (unsigned char)(v >> 24);
}

static uint32_t get_u32(const unsigned char *p) {
    return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}

/* ---------------------------------------------------------------- launch */

#ifndef SYS_open_tree
#define SYS_open_tree 428
#endif
#ifndef SYS_move_mount
#define SYS_move_mount 429
#endif
#ifndef SYS_mount_setattr
#define SYS_mount_setattr 442
#endif
#ifndef OPEN_TREE_CLONE
#define OPEN_TREE_CLONE 1
#endif
#ifndef OPEN_TREE_CLOEXEC
#define OPEN_TREE_CLOEXEC O_CLOEXEC
#endif
#ifndef AT_RECURSIVE
#define AT_RECURSIVE 0x8000
#endif
#ifndef MOVE_MOUNT_F_EMPTY_PATH
#define MOVE_MOUNT_F_EMPTY_PATH 0x00000004
#endif
#define SANDRL_MOUNT_ATTR_RDONLY 0x00000001
#define SANDRL_MOUNT_ATTR_NOSUID 0x00000002
#define SANDRL_MOUNT_ATTR_NODEV 0x00000004
#define SANDRL_MOUNT_ATTR_IDMAP 0x00100000

struct sandrl_mount_attr {
    uint64_t attr_set;
    uint64_t attr_clr;
    uint64_t propagation;
    uint64_t userns_fd;
};

#define MAX_LAYERS 128
#define MAX_OVERLAYS 16
#define MAX_MASKS 16
#define STAGE "/tmp/sandrl"

static void bring_loopback_up(void) {
    int s = socket(AF_INET, SOCK_DGRAM | SOCK_CLOEXEC, 0);
    if (s < 0) return;
    struct ifreq ifr;
    memset(&ifr, 0, sizeof ifr);
    strcpy(ifr.ifr_name, "lo");
    if (ioctl(s, SIOCGIFFLAGS, &ifr) == 0) {
        ifr.ifr_flags |= IFF_UP | IFF_RUNNING;
        (void)!ioctl(s, SIOCSIFFLAGS, &ifr);
    }
    close(s);
}

/* The launcher's children that made namespaces: reaped once the launch no longer waits on them
 * (before it execs bubblewrap, or once pid 1 has its root), so that their exit overlaps the mount
 * work instead of being waited for. */
static pid_t to_reap[4];
static int n_to_reap;

static void reap_children(void) {
    for (int i = 0; i < n_to_reap; i++) waitpid(to_reap[i], NULL, 0);
    n_to_reap = 0;
}

/* A user namespace made by a child of this process: started (the child unshares) and later
 * finished (this process writes the maps and opens it; the fd outlives the child), so that
 * the child's work overlaps the launcher's. Used for the store layers' idmapping. */
struct pending_userns {
    pid_t pid;
    int sync_fd, hold_fd;
};

static struct pending_userns start_userns(void) {
    int sync_pipe[2], hold_pipe[2];
    if (pipe2(sync_pipe, O_CLOEXEC) || pipe2(hold_pipe, O_CLOEXEC)) die("pipe");
    pid_t pid = fork();
    if (pid < 0) die("fork");
    if (pid == 0) {
        char c = 0;
        close(hold_pipe[1]);
        close(sync_pipe[0]);
        if (unshare(CLONE_NEWUSER)) _exit(2);
        if (write(sync_pipe[1], "u", 1) != 1) _exit(3);
        (void)!read(hold_pipe[0], &c, 1); /* until the parent has opened the namespace */
        _exit(0);
    }
    close(sync_pipe[1]);
    close(hold_pipe[0]);
    to_reap[n_to_reap++] = pid;
    return (struct pending_userns){pid, sync_pipe[0], hold_pipe[1]};
}

static int finish_userns(struct pending_userns ns, const char *map, int open_flags) {
    char c;
    if (read(ns.sync_fd, &c, 1) != 1) {
        errno = 0;
        die("could not create a user namespace (is user.max_user_namespaces 0?)");
    }
    char path[64];
    snprintf(path, sizeof path, "/proc/%d/uid_map", ns.pid);
    write_file_or_die(path, map);
    snprintf(path, sizeof path, "/proc/%d/gid_map", ns.pid);
    write_file_or_die(path, map);
    snprintf(path, sizeof path, "/proc/%d/ns/user", ns.pid);
    int fd = open(path, O_RDONLY | open_flags);
    if (fd < 0) die("open %s", path);
    close(ns.hold_fd);
    close(ns.sync_fd);
    return fd;
}

/* The sandbox's namespaces, made before bubblewrap runs:
 * - outer: owned by host uid `uid`, "0 uid 65537": pid 1's namespace (bubblewrap's --userns);
 * - inner: nested in outer, "0 1 65536", so host uid+1+n: where every command runs;
 * - net: a loopback-only network namespace owned by inner (so the sandbox's
 *   root keeps NET_BIND_SERVICE and NET_RAW there), which bubblewrap, pid 1 and every command
 *   start in.
 * Only a process inside outer may write inner's maps, so a child A (as `uid`) makes outer, this
 * process maps it, and A's child B makes inner (and net) for A to map. Seen from the host, inner
 * maps 0 -> uid+1 (65536 ids): the idmapping the host layers need, so it serves them too.
 * Started, mapped and finished in steps, so that the children's work overlaps the launcher's
 * mounts: B makes the network namespace after its user namespace is handed over. */
struct pending_sandbox_ns {
    pid_t a, b;
    int up, down, hold, net_ready;
};

static struct pending_sandbox_ns start_sandbox_namespaces(uid_t uid) {
    int up[2], down[2], hold[2], net_ready[2];
    if (pipe2(up, O_CLOEXEC) || pipe2(down, O_CLOEXEC) || pipe2(hold, O_CLOEXEC) || pipe2(net_ready, O_CLOEXEC))
        die("pipe");
    pid_t a = fork();
    if (a < 0) die("fork");
    if (a == 0) {
        char c = 0;
        close(up[0]);
        close(down[1]);
        close(hold[1]);
        close(net_ready[0]);
        if (setgroups(0, NULL) || setresgid(uid, uid, uid) || setresuid(uid, uid, uid)) _exit(1);
        prctl(PR_SET_DUMPABLE, 1); /* so that the parent may open its namespaces */
        if (unshare(CLONE_NEWUSER)) _exit(2);
        if (write(up[1], "u", 1) != 1) _exit(3);
        if (read(down[0], &c, 1) != 1) _exit(4); /* outer is mapped */
        int sync[2];
        if (pipe2(sync, O_CLOEXEC)) _exit(5);
        pid_t b = fork();
        if (b < 0) _exit(6);
        if (b == 0) {
            close(sync[0]);
            close(up[1]); /* so that the launcher sees A die if A fails after this */
            close(down[0]);
            if (unshare(CLONE_NEWUSER)) _exit(2);
            if (write(sync[1], "u", 1) != 1) _exit(3);
            /* Always: a sandbox never runs in the host's network namespace (its network, if
             * any, is slirp4netns's tap in this one). B has every capability in its own
             * namespace, mapped or not yet. */
            if (unshare(CLONE_NEWNET)) _exit(10);
            bring_loopback_up();
            if (write(net_ready[1], "n", 1) != 1) _exit(3);
            close(net_ready[1]);
            (void)!read(hold[0], &c, 1); /* until the launcher has opened the namespaces */
            _exit(0);
        }
        close(sync[1]);
        close(net_ready[1]); /* B's alone: the launcher sees EOF if B dies */
        if (read(sync[0], &c, 1) != 1) _exit(7);
        char path[64];
        const char *map = "0 1 65536\n";
        snprintf(path, sizeof path, "/proc/%d/uid_map", b);
        int fd = open(path, O_WRONLY | O_CLOEXEC);
        if (fd < 0 || write(fd, map, strlen(map)) != (ssize_t)strlen(map)) _exit(8);
        close(fd);
        snprintf(path, sizeof path, "/proc/%d/gid_map", b);
        fd = open(path, O_WRONLY | O_CLOEXEC);
        if (fd < 0 || write(fd, map, strlen(map)) != (ssize_t)strlen(map)) _exit(9);
        close(fd);
        if (write(up[1], &b, sizeof b) != (ssize_t)sizeof b) _exit(3);
        (void)!read(hold[0], &c, 1);
        waitpid(b, NULL, 0);
        _exit(0);
    }
    close(up[1]);
    close(down[0]);
    close(hold[0]);
    close(net_ready[1]);
    to_reap[n_to_reap++] = a;
    return (struct pending_sandbox_ns){a, -1, up[0], down[1], hold[1], net_ready[0]};
}

/* Map the outer namespace once A has made it; A then makes the inner one. */
static int map_outer_namespace(struct pending_sandbox_ns *ns, uid_t uid) {
    char c;
    if (read(ns->up, &c, 1) != 1) {
        errno = 0;
        die("could not create a user namespace (as uid %u; is user.max_user_namespaces 0?)", uid);
    }
    char path[64], map[64];
    snprintf(map, sizeof map, "0 %u 65537\n", uid);
    snprintf(path, sizeof path, "/proc/%d/uid_map", ns->a);
    write_file_or_die(path, map);
    snprintf(path, sizeof path, "/proc/%d/gid_map", ns->a);
    write_file_or_die(path, map);
    snprintf(path, sizeof path, "/proc/%d/ns/user", ns->a);
    int outer = open(path, O_RDONLY); /* not CLOEXEC: bubblewrap takes it as --userns */
    if (outer < 0) die("open %s", path);
    if (write(ns->down, "m", 1) != 1) die("namespace helper");
    return outer;
}

static int finish_sandbox_namespaces(struct pending_sandbox_ns *ns) {
    char path[64];
    pid_t b;
    if (read(ns->up, &b, sizeof b) != (ssize_t)sizeof b) {
        errno = 0;
        die("could not create the sandbox's nested user namespace");
    }
    snprintf(path, sizeof path, "/proc/%d/ns/user", b);
    int inner = open(path, O_RDONLY); /* not CLOEXEC: pid 1 keeps it for its commands */
    if (inner < 0) die("open %s", path);
    ns->b = b;
    return inner;
}

/* Enter B's network namespace (once B has made it) and let the children go; its fd, for pid 1. */
static int enter_network_namespace(struct pending_sandbox_ns *ns) {
    char c, path[64];
    if (read(ns->net_ready, &c, 1) != 1) {
        errno = 0;
        die("could not create the sandbox's network namespace");
    }
    snprintf(path, sizeof path, "/proc/%d/ns/net", ns->b);
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) die("open %s", path);
    if (setns(fd, CLONE_NEWNET)) die("entering the sandbox's network namespace");
    close(ns->net_ready);
    close(ns->hold);
    close(ns->up);
    close(ns->down);
    return fd;
}

/* Clone a layer directory as a detached mount, to be idmapped before it is attached. */
static int clone_layer(const char *src) {
    int fd = (int)syscall(SYS_open_tree, AT_FDCWD, src, OPEN_TREE_CLONE | OPEN_TREE_CLOEXEC | AT_RECURSIVE);
    if (fd < 0) die("open_tree %s", src);
    return fd;
}

/* Make a cloned layer read-only, with its files seen through the idmapping of `userns_fd`
 * (host root -> sandbox root for host directories, the store's own range -> sandbox ids for
 * store layers). A host directory given as --host-layer is then seen through mount_host_view. */
static void idmap_layer(int fd, const char *src, int userns_fd) {
    struct sandrl_mount_attr attr = {0};
    attr.attr_set = SANDRL_MOUNT_ATTR_IDMAP | SANDRL_MOUNT_ATTR_RDONLY | SANDRL_MOUNT_ATTR_NODEV |
                    SANDRL_MOUNT_ATTR_NOSUID;
    attr.userns_fd = (uint64_t)userns_fd;
    if (syscall(SYS_mount_setattr, fd, "", AT_EMPTY_PATH | AT_RECURSIVE, &attr, sizeof attr) != 0)
        die("idmapping %s (the kernel or the filesystem may not support idmapped mounts)", src);
}

/* Show the host directory attached at `lower` at `view` through a read-only overlay of its own,
 * mounted without CAP_DAC_OVERRIDE and CAP_DAC_READ_SEARCH. Overlayfs checks every lookup, open
 * and exec of a file against the file's own inode as it is *now*, with its mounter's credentials
 * (the sandbox's overlay, stacked on this one, with the caller's against a copy of the mode that
 * can be stale). This mounter is host root, which owns nothing there (the layer is idmapped: host
 * root's files are the sandbox's root's), so only what the host's unprivileged users may read can
 * be read through it, whenever the host changes it: a file made 0600 or a directory made 0700
 * after the sandbox looked at it, a root-only file made later. Copy-up reads through it too. */
static void mount_host_view(const char *lower, const char *view) {
    mkdir_or_die(view, 0755, (uid_t)-1);
    struct __user_cap_header_struct h = {_LINUX_CAPABILITY_VERSION_3, 0};
    struct __user_cap_data_struct saved[2], d[2];
    if (syscall(SYS_capget, &h, saved)) die("capget");
    memcpy(d, saved, sizeof d);
    d[CAP_TO_INDEX(CAP_DAC_OVERRIDE)].effective &= ~CAP_TO_MASK(CAP_DAC_OVERRIDE);
    d[CAP_TO_INDEX(CAP_DAC_READ_SEARCH)].effective &= ~CAP_TO_MASK(CAP_DAC_READ_SEARCH);
    if (syscall(SYS_capset, &h, d)) die("capset");
    char data[PATH_MAX + 64];
    /* Without an upper layer overlayfs wants two lower ones: the second is empty. */
    snprintf(data, sizeof data, "lowerdir=%s:" STAGE "/view-empty", lower);
    int failed = mount("overlay", view, "overlay", MS_RDONLY | MS_NOSUID | MS_NODEV, data);
    int err = errno;
    if (syscall(SYS_capset, &h, saved)) die("capset");
    errno = err;
    if (failed) die("mounting the host's unprivileged view of %s", lower);
}

static void attach_layer(int fd, const char *dest) {
    mkdir_or_die(dest, 0755, (uid_t)-1);
    if (syscall(SYS_move_mount, fd, "", AT_FDCWD, dest, MOVE_MOUNT_F_EMPTY_PATH) != 0) die("move_mount %s", dest);
    close(fd);
}

static void join_cgroup(const char *procs_path) {
    char buf[32];
    snprintf(buf, sizeof buf, "%d\n", getpid());
    write_file_or_die(procs_path, buf);
}

/* What a launch is told: on its command line, or (a pre-made launch, --args-fd) partly over its
 * socket once the sandbox it will be is known. */
struct launch_opts {
    const char *layers[MAX_LAYERS];
    int store_layer[MAX_LAYERS];
    int host_view[MAX_LAYERS]; /* --host-layer: seen through mount_host_view */
    const char *ov_target[MAX_OVERLAYS];
    const char *ov_layers[MAX_OVERLAYS];
    int n_layers, n_ov;
    uid_t uid, store_uid;
    unsigned long long tmpfs_bytes;
    const char *bwrap;
    int args_fd;
    int sock_fd;                 /* pid 1 made by the helper: the provider's socket, pid 1's to serve */
    const char *hostname;        /* pid 1 made by the helper: the sandbox's hostname */
    const char *masks[MAX_MASKS]; /* pid 1 made by the helper: the /proc entries that read as empty */
    int n_masks;
    int mask_fd; /* pid 1 made by the helper: the provider's read-only tmpfs with the file the masks show */
    char **rest; /* bubblewrap's arguments (after --); with pid 1 made by the helper, pid 1's */
    int n_rest;
};

static void parse_launch_opts(int argc, char **argv, struct launch_opts *o) {
    int i;
    for (i = 0; i < argc; i++) {
        const char *a = argv[i];
        if (!strcmp(a, "--")) {
            i++;
            break;
        } else if (!strcmp(a, "--uid") && i + 1 < argc) {
            o->uid = (uid_t)strtoul(argv[++i], NULL, 10);
        } else if (!strcmp(a, "--cgroup-procs") && i + 1 < argc) {
            join_cgroup(argv[++i]);
        } else if (!strcmp(a, "--tmpfs-bytes") && i + 1 < argc) {
            o->tmpfs_bytes = strtoull(argv[++i], NULL, 10);
        } else if (!strcmp(a, "--store-uid") && i + 1 < argc) {
            o->store_uid = (uid_t)strtoul(argv[++i], NULL, 10);
        } else if ((!strcmp(a, "--layer") || !strcmp(a, "--store-layer") || !strcmp(a, "--host-layer")) &&
                   i + 1 < argc && o->n_layers < MAX_LAYERS) {
            o->store_layer[o->n_layers] = a[2] == 's';
            o->host_view[o->n_layers] = a[2] == 'h';
            o->layers[o->n_layers++] = argv[++i];
        } else if (!strcmp(a, "--overlay") && i + 2 < argc && o->n_ov < MAX_OVERLAYS) {
            o->ov_target[o->n_ov] = argv[++i];
            o->ov_layers[o->n_ov++] = argv[++i];
        } else if (!strcmp(a, "--bwrap") && i + 1 < argc) {
            o->bwrap = argv[++i];
        } else if (!strcmp(a, "--args-fd") && i + 1 < argc) {
            o->args_fd = atoi(argv[++i]);
        } else if (!strcmp(a, "--times")) {
            launch_times = 1;
        } else if (!strcmp(a, "--sock-fd") && i + 1 < argc) {
            o->sock_fd = atoi(argv[++i]);
        } else if (!strcmp(a, "--hostname") && i + 1 < argc) {
            o->hostname = argv[++i];
        } else if (!strcmp(a, "--mask") && i + 1 < argc && o->n_masks < MAX_MASKS) {
            o->masks[o->n_masks++] = argv[++i];
        } else if (!strcmp(a, "--mask-fd") && i + 1 < argc) {
            o->mask_fd = atoi(argv[++i]);
            if (fcntl(o->mask_fd, F_SETFD, FD_CLOEXEC)) die("--mask-fd %d", o->mask_fd); /* never the agent's */
        } else {
            errno = 0;
            die("launch: unknown or incomplete option %s", a);
        }
    }
    if (i <= argc) {
        o->rest = argv + i;
        o->n_rest = argc - i;
    }
}

/* A pre-made launch's second half of its arguments: u32 length, then NUL-terminated strings.
 * Read exactly that much: the same socket then carries pid 1's protocol. EOF (the provider closed
 * it: the pre-made launch was not needed, or the provider died) ends the launch quietly. */
static void read_launch_bytes(int fd, void *buf, size_t len) {
    size_t got = 0;
    while (got < len) {
        ssize_t n = read(fd, (char *)buf + got, len - got);
        if (n == 0) _exit(0);
        if (n < 0 && errno == EINTR) continue;
        if (n < 0) die("reading the launch's arguments");
        got += (size_t)n;
    }
}

static void read_launch_args(int fd, int *argc, char ***argv) {
    unsigned char len_buf[4];
    read_launch_bytes(fd, len_buf, sizeof len_buf);
    uint32_t len = get_u32(len_buf);
    if (len == 0 || len > (1u << 20)) {
        errno = 0;
        die("launch: arguments of %u bytes", len);
    }
    char *buf = malloc(len);
    if (!buf) die("malloc");
    read_launch_bytes(fd, buf, len);
    if (buf[len - 1] != '\0') {
        errno = 0;
        die("launch: arguments not NUL-terminated");
    }
    int count = 0;
    for (uint32_t k = 0; k < len; k++) count += buf[k] == '\0';
    char **args = calloc((size_t)count + 1, sizeof(char *));
    if (!args) die("calloc");
    char *p = buf;
    for (int k = 0; k < count; k++) {
        args[k] = p;
        p += strlen(p) + 1;
    }
    *argc = count;
    *argv = args;
}

/* The sandbox's namespaces (see start_sandbox_namespaces), and the store layers' one when asked:
 * started by children, mapped and opened here. */
struct launch_ns {
    struct pending_userns store;
    struct pending_sandbox_ns sandbox;
    int userns_fd, store_fd, inner_fd;
};

static void start_namespaces(struct launch_ns *ns, const struct launch_opts *o, int with_store) {
    ns->store = (struct pending_userns){-1, -1, -1};
    ns->userns_fd = ns->store_fd = ns->inner_fd = -1;
    if (with_store) ns->store = start_userns();
    ns->sandbox = start_sandbox_namespaces(o->uid);
}

static void finish_namespaces(struct launch_ns *ns, const struct launch_opts *o, int with_store) {
    ns->userns_fd = map_outer_namespace(&ns->sandbox, o->uid);
    if (with_store) {
        char map[96];
        snprintf(map, sizeof map, "%u %u 65536\n", o->store_uid, o->uid + 1);
        ns->store_fd = finish_userns(ns->store, map, O_CLOEXEC);
    }
    ns->inner_fd = finish_sandbox_namespaces(&ns->sandbox);
}

/* The launcher's own mount namespace, where it builds the root: nothing in it reaches the host's. */
static void private_mount_namespace(void) {
    if (unshare(CLONE_NEWNS)) die("unshare(CLONE_NEWNS)");
    if (mount(NULL, "/", NULL, MS_REC | MS_PRIVATE, NULL)) die("making / private");
}

/* The host's mounts that --host-layer directories are on: one view (mount_host_view) of each
 * mount's top, every such directory on it seen as a subdirectory of that view, rather than a view
 * of each directory (/usr, /etc, /bin...): every filesystem instance costs each memory cgroup of
 * the host a slot of its shrinker map (launch.py's empty_file_mount). */
#define MAX_HOST_MOUNTS 16
static struct host_mount {
    uint64_t id;
    char top[PATH_MAX];
    int fd; /* its top, cloned (not its submounts: an overlay's layer shows none) */
} host_mounts[MAX_HOST_MOUNTS];
static int n_host_mounts;
static int view_of[MAX_LAYERS];        /* a --host-layer's index in host_mounts */
static const char *view_sub[MAX_LAYERS]; /* and its path under that mount's top ("" for the top) */

/* The id of the mount `path` is on (statx's STATX_MNT_ID, read from the kernel's struct statx). */
static uint64_t mount_id(const char *path) {
    unsigned char buf[256];
    memset(buf, 0, sizeof buf);
    if (syscall(SYS_statx, AT_FDCWD, path, AT_SYMLINK_NOFOLLOW, 0x1000u, buf)) die("statx %s", path);
    uint32_t mask;
    uint64_t id;
    memcpy(&mask, buf, sizeof mask);
    memcpy(&id, buf + 144, sizeof id);
    if (!(mask & 0x1000u)) {
        errno = 0;
        die("statx %s: no mount id (Linux 5.8 or later)", path);
    }
    return id;
}

/* Which host mount the host directory `path` (absolute, with no symlink in it) is on: its top is
 * the highest directory above `path` on the same mount. */
static int host_mount_of(const char *path, const char **sub) {
    uint64_t id = mount_id(path);
    char top[PATH_MAX], parent[PATH_MAX];
    snprintf(top, sizeof top, "%s", path);
    while (strcmp(top, "/")) {
        snprintf(parent, sizeof parent, "%s", top);
        char *slash = strrchr(parent, '/');
        if (slash == parent) slash[1] = '\0';
        else *slash = '\0';
        if (mount_id(parent) != id) break;
        snprintf(top, sizeof top, "%s", parent);
    }
    size_t len = strcmp(top, "/") ? strlen(top) : 0;
    *sub = path + len + (path[len] == '/');
    for (int m = 0; m < n_host_mounts; m++)
        if (host_mounts[m].id == id && !strcmp(host_mounts[m].top, top)) return m;
    if (n_host_mounts == MAX_HOST_MOUNTS) {
        errno = 0;
        die("launch: host layers on more than %d mounts", MAX_HOST_MOUNTS);
    }
    struct host_mount *m = &host_mounts[n_host_mounts];
    m->id = id;
    snprintf(m->top, sizeof m->top, "%s", top);
    m->fd = (int)syscall(SYS_open_tree, AT_FDCWD, top, OPEN_TREE_CLONE | OPEN_TREE_CLOEXEC);
    if (m->fd < 0) die("open_tree %s", top);
    return n_host_mounts++;
}

/* The image's layers as detached mounts, cloned before the writable layer's tmpfs covers /tmp,
 * where a state directory may be; a --host-layer's mount, once for all of them on it. */
static void clone_layers(const struct launch_opts *o, int *layer_fds) {
    for (int l = 0; l < o->n_layers; l++) {
        if (o->host_view[l]) {
            layer_fds[l] = -1;
            view_of[l] = host_mount_of(o->layers[l], &view_sub[l]);
        } else {
            layer_fds[l] = clone_layer(o->layers[l]);
        }
    }
}

/* Where layer `l` is seen from the overlays once finish_root has attached it. */
static void layer_dir(const struct launch_opts *o, int l, char *buf, size_t size) {
    if (!o->host_view[l]) snprintf(buf, size, STAGE "/lower/%d", l);
    else snprintf(buf, size, STAGE "/view/%d%s%s", view_of[l], *view_sub[l] ? "/" : "", view_sub[l]);
}

/* The writable layer (in the private mount namespace), once the layers are cloned. Its source
 * shows in the sandbox where a part of it is mounted there: bubblewrap's masks of /proc entries
 * ("sandrl"), or the /dev the helper makes on it for its own pid 1 ("tmpfs", as bubblewrap's
 * --dev shows). */
static void start_root(const struct launch_opts *o, const char *source) {
    char opts[128];
    snprintf(opts, sizeof opts, "size=%llu,mode=0755", o->tmpfs_bytes);
    if (mount(source, "/tmp", "tmpfs", MS_NOSUID | MS_NODEV, opts)) die("mounting the writable layer");
    mkdir_or_die(STAGE, 0755, (uid_t)-1);
    mkdir_or_die(STAGE "/lower", 0755, (uid_t)-1);
    mkdir_or_die(STAGE "/upper", 0755, (uid_t)-1);
    mkdir_or_die(STAGE "/work", 0700, (uid_t)-1);
}

/* What a full launch's bubblewrap needs on the sandbox's tmpfs: the file its masks of /proc
 * entries bind, and its scratch directory. */
static void stage_for_bwrap(const struct launch_opts *o) {
    create_empty_or_die(STAGE "/empty");
    char scratch[64];
    snprintf(scratch, sizeof scratch, "/tmp/.bubblewrap-%u", o->uid);
    mkdir_or_die(scratch, 0755, o->uid);
}

/* Idmap and attach the layers (a host mount's top, viewed, for the host layers on it), and mount
 * the overlays on STAGE/root. */
static void finish_root(const struct launch_opts *o, int *layer_fds, const struct launch_ns *ns) {
    uid_t root = o->uid + 1;
    char path[PATH_MAX];
    for (int l = 0; l < o->n_layers; l++) {
        if (o->host_view[l]) continue;
        idmap_layer(layer_fds[l], o->layers[l], o->store_layer[l] ? ns->store_fd : ns->inner_fd);
        snprintf(path, sizeof path, STAGE "/lower/%d", l);
        attach_layer(layer_fds[l], path);
    }
    if (n_host_mounts) {
        mkdir_or_die(STAGE "/host", 0755, (uid_t)-1);
        mkdir_or_die(STAGE "/view", 0755, (uid_t)-1);
        mkdir_or_die(STAGE "/view-empty", 0755, (uid_t)-1);
    }
    for (int m = 0; m < n_host_mounts; m++) {
        char view[64];
        idmap_layer(host_mounts[m].fd, host_mounts[m].top, ns->inner_fd);
        snprintf(path, sizeof path, STAGE "/host/%d", m);
        attach_layer(host_mounts[m].fd, path);
        snprintf(view, sizeof view, STAGE "/view/%d", m);
        mount_host_view(path, view);
    }
    for (int ov = 0; ov < o->n_ov; ov++) {
        char upper[64], work[64], target[PATH_MAX], lowers[8192] = "";
        snprintf(upper, sizeof upper, STAGE "/upper/%d", ov);
        snprintf(work, sizeof work, STAGE "/work/%d", ov);
        mkdir_or_die(upper, 0755, root);
        mkdir_or_die(work, 0700, root);
        /* "0,3" -> STAGE/lower/0:STAGE/lower/3 (first = topmost) */
        char spec[1024];
        snprintf(spec, sizeof spec, "%s", o->ov_layers[ov]);
        for (char *tok = strtok(spec, ","); tok; tok = strtok(NULL, ",")) {
            int idx = atoi(tok);
            if (idx < 0 || idx >= o->n_layers) {
                errno = 0;
                die("launch: overlay %s names layer %d of %d", o->ov_target[ov], idx, o->n_layers);
            }
            size_t len = strlen(lowers);
            layer_dir(o, idx, path, sizeof path);
            if (strchr(path, ':') || strchr(path, ',') || strchr(path, '\\')) {
                errno = 0; /* overlayfs would split it */
                die("launch: a host layer's path holds ':', ',' or '\\': %s", path);
            }
            if (snprintf(lowers + len, sizeof lowers - len, "%s%s", len ? ":" : "", path) >= (int)(sizeof lowers - len)) {
                errno = 0;
                die("launch: overlay %s has too many layers", o->ov_target[ov]);
            }
        }
        snprintf(target, sizeof target, STAGE "/root%s", strcmp(o->ov_target[ov], "/") ? o->ov_target[ov] : "");
        if (ov == 0) mkdir_or_die(STAGE "/root", 0755, (uid_t)-1);
        /* Directories take their attributes from the upper layer: give it the lower's mode. */
        struct stat st;
        layer_dir(o, atoi(o->ov_layers[ov]), path, sizeof path);
        if (stat(path, &st) == 0) chmod(upper, st.st_mode & 07777);
        char data[8448];
        snprintf(data, sizeof data, "lowerdir=%s,upperdir=%s,workdir=%s", lowers, upper, work);
        if (mount("overlay", target, "overlay", MS_NOSUID | MS_NODEV, data)) die("mounting overlay on %s", target);
    }
}


/* ---------------------------------------------------------------- pid 1 made by the helper
 *
 * The helper does bubblewrap's part itself: bubblewrap costs ~3 ms of CPU per launch (its C
 * library's start-up, and a parse of the whole mount table after each of its ~17 bind mounts),
 * which a fork's 16 children pay at once and every cold create waits for. Pid 1 is made with the
 * sandbox's namespaces as bubblewrap makes them (pid, mount, ipc, uts and cgroup ones, inside the
 * outer user namespace, so every mount copied into its mount namespace is locked), and builds
 * bubblewrap's /proc (with our masks) and a devpts at a staging place while the launcher builds
 * the root (for a launch made ahead, before the image is known), with bubblewrap's /dev on the
 * sandbox's tmpfs. The launcher passes the root to pid 1 as a detached mount (open_tree); pid 1
 * attaches it, moves /proc and /dev/pts into it, pivots into it and execs the agent as bubblewrap
 * would: Docker's capabilities, a new session, and for environment only the word that its seccomp
 * filter is on (installed, with the bounding set, before the root came). The tests that hold the
 * sandbox's surface to bubblewrap's run on sandboxes made every way. No filesystem instance is made
 * that a bind of one the sandbox has anyway can stand for: each costs every memory cgroup of the
 * host (launch.py's empty_file_mount). */

#define PID1_STAGE "/tmp"

/* Docker's default capability set: launch.py's DEFAULT_CAPS, which bubblewrap gets for a full launch. */
static const int docker_caps[] = {CAP_CHOWN,  CAP_DAC_OVERRIDE, CAP_FSETID,  CAP_FOWNER,           CAP_MKNOD,
                                  CAP_NET_RAW, CAP_SETGID,       CAP_SETUID,  CAP_SETFCAP,          CAP_SETPCAP,
                                  CAP_NET_BIND_SERVICE, CAP_SYS_CHROOT, CAP_KILL, CAP_AUDIT_WRITE};

static void mount_or_die(const char *src, const char *dst, const char *type, unsigned long flags, const char *data) {
    if (mount(src, dst, type, flags, data)) die("mounting %s on %s", src ? src : "(remount)", dst);
}

/* A bind mount with bubblewrap's flags for it (always nosuid, plus `flags`). */
static void bind_or_die(const char *src, const char *dst, unsigned long flags) {
    mount_or_die(src, dst, NULL, MS_BIND, NULL);
    mount_or_die(NULL, dst, NULL, MS_BIND | MS_REMOUNT | MS_NOSUID | flags, NULL);
}

static void symlink_or_die(const char *target, const char *path) {
    if (symlink(target, path)) die("symlink %s", path);
}

/* bubblewrap's --proc (with its covers of sys, sysrq-trigger, irq and bus) and our masks. The masks
 * show the empty file of the provider's read-only tmpfs (--mask-fd, one for all its sandboxes), as
 * bubblewrap's show one on the sandbox's tmpfs (source "sandrl" both): a tmpfs of pid 1's own would
 * stay alive for them, and every filesystem instance costs each memory cgroup of the host a slot
 * of its shrinker map (see launch.py). */
static void stage_proc(const struct launch_opts *o) {
    const char *dir = PID1_STAGE "/proc";
    mkdir_or_die(dir, 0755, (uid_t)-1);
    mount_or_die("proc", dir, "proc", MS_NOSUID | MS_NOEXEC | MS_NODEV, NULL);
    static const char *const covered[] = {"sys", "sysrq-trigger", "irq", "bus"};
    char path[PATH_MAX];
    for (size_t i = 0; i < sizeof covered / sizeof *covered; i++) {
        snprintf(path, sizeof path, "%s/%s", dir, covered[i]);
        if (access(path, W_OK) < 0) {
            if (errno == EACCES || errno == ENOENT || errno == EROFS) continue;
            die("access %s", path);
        }
        bind_or_die(path, path, MS_RDONLY | MS_NODEV | MS_NOEXEC);
    }
    char first[PATH_MAX] = "";
    for (int i = 0; i < o->n_masks; i++) {
        if (strncmp(o->masks[i], "/proc/", 6) || strstr(o->masks[i], "..")) {
            errno = 0;
            die("launch: --mask %s is not under /proc", o->masks[i]);
        }
        snprintf(path, sizeof path, "%s/%s", dir, o->masks[i] + 6);
        if (first[0]) {
            bind_or_die(first, path, MS_RDONLY | MS_NODEV);
            continue;
        }
        if (o->mask_fd < 0) {
            errno = 0;
            die("launch: --mask needs --mask-fd");
        }
        int empty = (int)syscall(SYS_open_tree, o->mask_fd, "empty", OPEN_TREE_CLONE | OPEN_TREE_CLOEXEC);
        if (empty < 0) die("open_tree of the masks' empty file");
        if (syscall(SYS_move_mount, empty, "", AT_FDCWD, path, MOVE_MOUNT_F_EMPTY_PATH)) die("move_mount %s", path);
        close(empty);
        mount_or_die(NULL, path, NULL, MS_BIND | MS_REMOUNT | MS_NOSUID | MS_RDONLY | MS_NODEV, NULL);
        snprintf(first, sizeof first, "%s", path);
    }
}

/* A new devpts for pid 1's /dev/pts, mounted in the sandbox's user namespace as bubblewrap's is:
 * staged now, moved into /dev once the root has come. */
static void stage_devpts(void) {
    mkdir_or_die(PID1_STAGE "/pts", 0755, (uid_t)-1);
    mount_or_die("devpts", PID1_STAGE "/pts", "devpts", MS_NOSUID | MS_NOEXEC, "newinstance,ptmxmode=0666,mode=620");
}

static void chown_or_die(const char *path, uid_t uid) {
    if (lchown(path, uid, uid)) die("chown %s", path);
}

/* bubblewrap's --dev (but /dev/pts, pid 1's: stage_devpts) and our --chmod 1777 /dev/shm, built by
 * the launcher on the sandbox's own tmpfs (the writable layer, mounted as "tmpfs": the source
 * bubblewrap's /dev shows) and bound on the root's /dev: not a tmpfs of its own, since every
 * filesystem instance costs each memory cgroup of the host a slot of its shrinker map (launch.py).
 * Owned as pid 1 would have made it (the sandbox's host uid `owner`, whom no command's namespace
 * maps). What it holds (/dev/shm's files) counts against the disk's size, and its pages against the
 * sandbox's memory, as the rest of that tmpfs. */
static void build_dev(uid_t owner) {
    const char *dir = STAGE "/dev";
    mkdir_or_die(dir, 0755, owner);
    static const char *const nodes[] = {"null", "zero", "full", "random", "urandom", "tty"};
    char path[PATH_MAX], src[64];
    for (size_t i = 0; i < sizeof nodes / sizeof *nodes; i++) {
        snprintf(path, sizeof path, "%s/%s", dir, nodes[i]);
        snprintf(src, sizeof src, "/dev/%s", nodes[i]);
        create_empty_or_die(path);
        bind_or_die(src, path, 0);
    }
    static const char *const links[][2] = {{"/proc/self/fd/0", "stdin"}, {"/proc/self/fd/1", "stdout"},
                                           {"/proc/self/fd/2", "stderr"}, {"/proc/self/fd", "fd"},
                                           {"/proc/kcore", "core"}, {"pts/ptmx", "ptmx"}};
    for (size_t i = 0; i < sizeof links / sizeof *links; i++) {
        snprintf(path, sizeof path, "%s/%s", dir, links[i][1]);
        symlink_or_die(links[i][0], path);
        chown_or_die(path, owner);
    }
    mkdir_or_die(STAGE "/dev/shm", 01777, owner);
    mkdir_or_die(STAGE "/dev/pts", 0755, owner);
    /* The image's /dev, which must be a directory: a symlink would be followed in the launcher's
     * tree, the host's. */
    const char *at = STAGE "/root/dev";
    struct stat st;
    if (lstat(at, &st) != 0) {
        mkdir_or_die(at, 0755, owner);
    } else if (!S_ISDIR(st.st_mode)) {
        errno = 0;
        die("the image's /dev is not a directory");
    }
    mount_or_die(dir, at, NULL, MS_BIND | MS_REC, NULL);
    mount_or_die(NULL, at, NULL, MS_BIND | MS_REMOUNT | MS_NOSUID | MS_NODEV, NULL);
}

/* Keep only Docker's capabilities, in the bounding set and in pid 1's own and ambient sets, as
 * bubblewrap's --cap-add leaves them (the agent drops from its commands what is not in its bounding
 * set). */
static uint64_t docker_cap_mask(void) {
    uint64_t keep = 0;
    for (size_t i = 0; i < sizeof docker_caps / sizeof *docker_caps; i++) keep |= 1ULL << docker_caps[i];
    return keep;
}

/* The bounding set's part of keep_docker_caps, which the caps pid 1 needs until its pivot do not
 * depend on (the bounding set limits only what an exec grants). */
static void bound_to_docker_caps(void) {
    uint64_t keep = docker_cap_mask();
    for (int c = 0; c < 64; c++) {
        if (keep & (1ULL << c)) continue;
        if (prctl(PR_CAPBSET_DROP, c, 0, 0, 0) && errno != EINVAL) die("dropping capability %d", c);
    }
}

static void keep_docker_caps(void) {
    uint64_t keep = docker_cap_mask();
    struct __user_cap_header_struct h = {_LINUX_CAPABILITY_VERSION_3, 0};
    struct __user_cap_data_struct d[2];
    memset(d, 0, sizeof d);
    d[0].effective = d[0].permitted = d[0].inheritable = (uint32_t)keep;
    d[1].effective = d[1].permitted = d[1].inheritable = (uint32_t)(keep >> 32);
    if (syscall(SYS_capset, &h, d)) die("capset");
    for (size_t i = 0; i < sizeof docker_caps / sizeof *docker_caps; i++)
        if (prctl(PR_CAP_AMBIENT, PR_CAP_AMBIENT_RAISE, docker_caps[i], 0, 0) && errno != EINVAL)
            die("raising ambient capability %d", docker_caps[i]);
}

/* The message that carries the root from the launcher to pid 1: one byte and one fd. */
struct fd_message {
    char byte;
    struct iovec iov;
    struct msghdr msg;
    union {
        struct cmsghdr align;
        char buf[CMSG_SPACE(2 * sizeof(int))];
    } control;
};

static void fd_message_init(struct fd_message *m) {
    memset(m, 0, sizeof *m);
    m->iov = (struct iovec){&m->byte, 1};
    m->msg.msg_iov = &m->iov;
    m->msg.msg_iovlen = 1;
    m->msg.msg_control = m->control.buf;
    m->msg.msg_controllen = sizeof m->control.buf;
}

/* Receive the root (a detached mount) and the sandbox's network namespace from the launcher; EOF
 * (the launch was not needed, or the launcher died) ends pid 1 quietly. */
static int receive_root(int sock, int *net_fd) {
    struct fd_message m;
    fd_message_init(&m);
    ssize_t n;
    do n = recvmsg(sock, &m.msg, MSG_CMSG_CLOEXEC);
    while (n < 0 && errno == EINTR);
    if (n == 0) _exit(0);
    struct cmsghdr *c = CMSG_FIRSTHDR(&m.msg);
    if (n != 1 || !c || c->cmsg_level != SOL_SOCKET || c->cmsg_type != SCM_RIGHTS ||
        c->cmsg_len != CMSG_LEN(2 * sizeof(int))) {
        errno = 0;
        die("pid 1: no root from the launcher");
    }
    int fds[2];
    memcpy(fds, CMSG_DATA(c), sizeof fds);
    *net_fd = fds[1];
    return fds[0];
}

/* Send pid 1 its root and network namespace, then its command line (as the provider sends a
 * launch's: u32 length, then NUL-terminated strings). */
static void send_root(int sock, int root_fd, int net_fd, char **args, int n_args) {
    struct fd_message m;
    fd_message_init(&m);
    m.byte = 'r';
    struct cmsghdr *c = CMSG_FIRSTHDR(&m.msg);
    c->cmsg_level = SOL_SOCKET;
    c->cmsg_type = SCM_RIGHTS;
    c->cmsg_len = CMSG_LEN(2 * sizeof(int));
    int fds[2] = {root_fd, net_fd};
    memcpy(CMSG_DATA(c), fds, sizeof fds);
    if (sendmsg(sock, &m.msg, MSG_NOSIGNAL) != 1) die("handing the root to pid 1");
    size_t len = 0;
    for (int i = 0; i < n_args; i++) len += strlen(args[i]) + 1;
    unsigned char *buf = malloc(4 + len);
    if (!buf) die("malloc");
    put_u32(buf, (uint32_t)len);
    size_t off = 4;
    for (int i = 0; i < n_args; i++) {
        size_t l = strlen(args[i]) + 1;
        memcpy(buf + off, args[i], l);
        off += l;
    }
    for (size_t done = 0; done < off;) {
        ssize_t w = send(sock, buf + done, off - done, MSG_NOSIGNAL);
        if (w < 0 && errno == EINTR) continue;
        if (w <= 0) die("handing pid 1 its arguments");
        done += (size_t)w;
    }
    free(buf);
}

static void build_seccomp(void);
static struct sock_fprog seccomp_prog;
#define FILTERED_ENV "SANDRL_SECCOMP=pid1"
/* Tells the agent pid 1 execs that the filter on it is its own (installed by pid1_main below). */

/* Pid 1, from its birth to the agent: /proc and /dev/pts now, the root when the launcher sends it. */
static void pid1_main(const struct launch_opts *o, int sock, int self_fd, int userns_fd, int inner_fd) {
    close(userns_fd); /* pid 1 is in it; nothing of it may reach the agent */
    if (prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0)) die("prctl(PR_SET_NO_NEW_PRIVS)");
    if (mount(NULL, "/", NULL, MS_REC | MS_PRIVATE, NULL)) die("making / private");
    if (o->hostname && sethostname(o->hostname, strlen(o->hostname))) die("sethostname");
    /* Where /proc and /dev/pts wait for the root: dropped with the old root at the pivot. */
    mount_or_die("tmpfs", PID1_STAGE, "tmpfs", MS_NOSUID | MS_NODEV, "size=64k,mode=0755");
    mkdir_or_die(PID1_STAGE "/root", 0755, (uid_t)-1);
    stage_proc(o);
    if (o->mask_fd >= 0) close(o->mask_fd);
    stage_devpts();
    /* What does not depend on the root, before it comes (for a launch made ahead, while nobody
     * waits): the bounding set, and the seccomp filter the agent would otherwise install on itself
     * (the kernel compiles it: ~0.15 ms, with the drops ~0.2 ms of each child of a fork). It stays
     * through the exec (no_new_privs is set) and allows every step from here to the agent. */
    bound_to_docker_caps();
    build_seccomp();
    if (prctl(PR_SET_SECCOMP, SECCOMP_MODE_FILTER, &seccomp_prog)) die("installing the seccomp filter");

    int net_fd;
    int root = receive_root(sock, &net_fd);
    /* Pid 1 was made while the kernel still made the network namespace: it enters it now, before
     * its root, its agent or any command of the sandbox runs (none ever runs in the host's). */
    if (setns(net_fd, CLONE_NEWNET)) die("entering the sandbox's network namespace");
    close(net_fd);
    int argc;
    char **argv;
    read_launch_args(sock, &argc, &argv);
    if (syscall(SYS_move_mount, root, "", AT_FDCWD, PID1_STAGE "/root", MOVE_MOUNT_F_EMPTY_PATH))
        die("attaching the sandbox's root");
    close(root);
    close(sock);
    /* /dev came with the root (build_dev); /proc and /dev/pts are pid 1's. */
    struct stat st;
    if (lstat(PID1_STAGE "/root/proc", &st) != 0) {
        mkdir_or_die(PID1_STAGE "/root/proc", 0755, (uid_t)-1);
    } else if (!S_ISDIR(st.st_mode)) {
        /* A symlink would be followed from the host's tree, where pid 1 still is. */
        errno = 0;
        die("the image's /proc is not a directory");
    }
    mount_or_die(PID1_STAGE "/proc", PID1_STAGE "/root/proc", NULL, MS_MOVE, NULL);
    mount_or_die(PID1_STAGE "/pts", PID1_STAGE "/root/dev/pts", NULL, MS_MOVE, NULL);
    /* As bubblewrap: pivot onto the new root with the old one on top of it, then detach the old. */
    int old_root = open("/", O_DIRECTORY | O_RDONLY | O_CLOEXEC);
    if (old_root < 0) die("open /");
    if (chdir(PID1_STAGE "/root")) die("chdir to the new root");
    if (syscall(SYS_pivot_root, ".", ".")) die("pivot_root");
    if (fchdir(old_root)) die("fchdir to the old root");
    if (umount2(".", MNT_DETACH)) die("detaching the old root");
    close(old_root);
    if (chdir("/")) die("chdir /");

    keep_docker_caps();
    if (setsid() < 0) die("setsid");
    char self_path[40], inner_str[16];
    snprintf(self_path, sizeof self_path, "/proc/self/fd/%d", self_fd);
    snprintf(inner_str, sizeof inner_str, "%d", inner_fd);
    for (int i = 0; i < argc; i++) {
        if (!strcmp(argv[i], "@AGENT@")) argv[i] = self_path;
        else if (!strcmp(argv[i], "@INNER_USERNS@")) argv[i] = inner_str;
    }
    char *filtered_env[] = {FILTERED_ENV, NULL};
    mark("agent", now_us());
    execve(self_path, argv, filtered_env);
    die("exec the agent");
}

/* Pid 1 of a pre-made launch, made by a child that enters the sandbox's user namespace as
 * bubblewrap does (as the sandbox's host uid, with its own session keyring) and unshares the
 * others; pid 1 is its child, and the launcher's once it exits (the launcher is a subreaper). */
static pid_t start_pid1(const struct launch_opts *o, const struct launch_ns *ns, const int pair[2], int self_fd) {
    int report[2];
    if (pipe2(report, O_CLOEXEC)) die("pipe");
    if (prctl(PR_SET_CHILD_SUBREAPER, 1)) die("prctl(PR_SET_CHILD_SUBREAPER)");
    pid_t m = fork();
    if (m < 0) die("fork");
    if (m == 0) {
        close(report[0]);
        become_sandbox_uid(o->uid);
        if (setns(ns->userns_fd, CLONE_NEWUSER)) die("entering the sandbox's user namespace");
        if (unshare(CLONE_NEWPID | CLONE_NEWNS | CLONE_NEWIPC | CLONE_NEWUTS | CLONE_NEWCGROUP))
            die("making the sandbox's namespaces");
        pid_t c = fork();
        if (c < 0) die("fork");
        if (c == 0) {
            close(report[1]);
            close(pair[0]); /* the launcher's end: pid 1 sees EOF on its own if the launcher ends */
            pid1_main(o, pair[1], self_fd, ns->userns_fd, ns->inner_fd);
            _exit(70);
        }
        if (write(report[1], &c, sizeof c) != (ssize_t)sizeof c) _exit(1);
        _exit(0);
    }
    close(report[1]);
    pid_t c = -1;
    ssize_t n = read(report[0], &c, sizeof c);
    close(report[0]);
    waitpid(m, NULL, 0);
    if (n != (ssize_t)sizeof c) {
        errno = 0;
        die("could not start the sandbox's pid 1");
    }
    return c;
}

/* The root's arguments are complete: the layers, the writable layer's size, an overlay, pid 1's
 * command line; a store layer needs the store's uid range. */
static void check_root_opts(const struct launch_opts *o, int with_store, const char *rest) {
    for (int l = 0; l < o->n_layers; l++)
        if (o->store_layer[l] && !with_store) {
            errno = 0;
            die("launch: --store-layer needs --store-uid");
        }
    if (o->tmpfs_bytes == 0 || o->n_ov == 0 || o->n_rest == 0) {
        errno = 0;
        die("launch: need --tmpfs-bytes, --overlay and %s after --", rest);
    }
}

/* Once pid 1 has its root, the monitor's mount namespace (where the root was built: a copy of every
 * host mount, and the sandbox's layers, views, overlays and /dev, which pid 1 holds copies of) keeps
 * nothing but the sandbox's disk: a host filesystem unmounted while the sandbox lives is released
 * (its copy here kept it alive), and each mount was a mnt_cache object and its name for as long as
 * the sandbox lived. The provider reads the overlays' upper directories through the monitor's root,
 * /proc/<pid>/root/tmp/sandrl/upper (and bubblewrap's launches keep that path): the root becomes the
 * disk's top, where "tmp" is a link to the top itself. A chroot, not a pivot_root (which walks every
 * thread of the host); the old root and every mount under it, this tmpfs's place on /tmp included,
 * detached in one lazy unmount (one grace period for all). The disk's mount stays only as this
 * process's root; the namespace keeps only the mount the old root was on, out of sight (its
 * mountinfo is empty). */
static void keep_only_the_disk(void) {
    symlink_or_die(".", "/tmp/tmp");
    int old_root = open("/", O_DIRECTORY | O_RDONLY | O_CLOEXEC);
    if (old_root < 0) die("open /");
    if (chroot("/tmp")) die("chroot to the sandbox's disk");
    if (fchdir(old_root)) die("fchdir to the old root");
    if (umount2(".", MNT_DETACH)) die("detaching the launcher's mounts");
    close(old_root);
    if (chdir("/")) die("chdir /");
}

/* A launch whose pid 1 the helper makes, from its namespaces to the monitor of its pid 1: a full
 * one (--sock-fd: every argument on the command line) or one made ahead (--args-fd: the image's
 * part comes over the socket when the launch is taken). */
static int pid1_launch_main(struct launch_opts *o) {
    struct launch_ns ns;
    int layer_fds[MAX_LAYERS];
    int ahead = o->args_fd >= 0;
    if (ahead) o->sock_fd = o->args_fd;
    int with_store = o->store_uid != 0;
    if (!ahead) check_root_opts(o, with_store, "pid 1's arguments");
    start_namespaces(&ns, o, with_store);
    private_mount_namespace();
    /* A full launch clones its layers while the children make the namespaces (no mount yet: pid 1's
     * mount namespace is copied from this one below, and must hold none of the root's). */
    if (!ahead) clone_layers(o, layer_fds);
    finish_namespaces(&ns, o, with_store);
    /* The network namespace (B's, ~0.6 ms of the kernel's after its user namespace) is waited for
     * only once pid 1 is made and the root built, which pid 1 enters before anything of the sandbox
     * runs (pid1_main); a launch made ahead has time, and lets B go now. */
    int net_fd = ahead ? enter_network_namespace(&ns.sandbox) : -1;
    if (ahead) reap_children();
    int self_fd = open("/proc/self/exe", O_RDONLY); /* pid 1 execs the agent through it */
    if (self_fd < 0) die("open /proc/self/exe");
    int pair[2];
    if (socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, pair)) die("socketpair");
    pid_t pid1 = start_pid1(o, &ns, pair, self_fd);
    mark("pid1", now_us());
    close(pair[1]);
    close(self_fd);
    if (o->mask_fd >= 0) close(o->mask_fd); /* pid 1's alone */

    if (ahead) {
        /* Wait for a sandbox to be given, or for pid 1's end (this launch is then of no use: the
         * provider finds it dead and discards it). */
        struct pollfd pf[2] = {{.fd = o->args_fd, .events = POLLIN}, {.fd = pair[0], .events = POLLIN}};
        while (poll(pf, 2, -1) < 0)
            if (errno != EINTR) die("poll");
        if (pf[1].revents && !pf[0].revents) {
            errno = 0;
            die("the sandbox's pid 1 ended before it was used");
        }
        int more_argc;
        char **more_argv;
        read_launch_args(o->args_fd, &more_argc, &more_argv);
        o->rest = NULL;
        o->n_rest = 0;
        parse_launch_opts(more_argc, more_argv, o);
        check_root_opts(o, with_store, "pid 1's arguments");
        clone_layers(o, layer_fds);
    }
    start_root(o, "tmpfs");
    finish_root(o, layer_fds, &ns);
    build_dev(o->uid);
    mark("root", now_us());
    /* The launcher enters it too, before pid 1 can answer the provider: the sandbox's host process
     * is in the sandbox's network namespace (slirp4netns and port forwards find it there). */
    if (net_fd < 0) net_fd = enter_network_namespace(&ns.sandbox);
    int root = (int)syscall(SYS_open_tree, AT_FDCWD, STAGE "/root", OPEN_TREE_CLONE | OPEN_TREE_CLOEXEC | AT_RECURSIVE);
    if (root < 0) die("open_tree %s", STAGE "/root");
    send_root(pair[0], root, net_fd, o->rest, o->n_rest);
    mark("sent", now_us());
    close(root);
    close(net_fd);
    close(pair[0]);
    if (o->sock_fd >= 0) close(o->sock_fd); /* the provider's socket is pid 1's now */
    close(ns.userns_fd);
    close(ns.inner_fd);
    if (ns.store_fd >= 0) close(ns.store_fd);
    reap_children();

    /* The monitor, as bubblewrap's: unprivileged, it ends with pid 1 and with its status. */
    keep_only_the_disk();
    drop_to_uid(o->uid);
    int status = 0;
    for (;;) {
        pid_t w = waitpid(-1, &status, 0);
        if (w == pid1) break;
        if (w < 0 && errno != EINTR) die("waiting for pid 1");
    }
    return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
}

static int launch_main(int argc, char **argv) {
    int64_t started = now_us();
    struct launch_opts o;
    memset(&o, 0, sizeof o);
    o.bwrap = "/usr/bin/bwrap";
    o.args_fd = o.sock_fd = o.mask_fd = -1;
    parse_launch_opts(argc - 1, argv + 1, &o); /* joins the cgroups as it reads them */
    mark("started", started);
    mark("joined", now_us());
    if (o.uid == 0) {
        errno = 0;
        die("launch: need --uid");
    }
    /* The helper makes pid 1: in full now (--sock-fd), or ahead (--args-fd: every namespace and
     * pid 1 now, while nobody waits; the image and the sandbox's own arguments when the provider
     * hands this launch a sandbox). Otherwise (--bwrap) bubblewrap makes it. */
    if (o.args_fd >= 0 || o.sock_fd >= 0) return pid1_launch_main(&o);
    struct launch_ns ns;
    int layer_fds[MAX_LAYERS];
    if (o.tmpfs_bytes == 0 || o.n_ov == 0 || o.n_rest == 0) {
        errno = 0;
        die("launch: need --tmpfs-bytes, --overlay and the bubblewrap arguments after --");
    }
    /* Host uid `uid` is the supervisor (pid 1, root of the outer user namespace); the sandbox's own
     * processes run in the nested one, where root is host uid+1 and uid n is host uid+1+n, so pid
     * 1's uid is not mapped where they run. Namespaces are made by children while this process
     * mounts: started first, used last. */
    int with_store = 0;
    for (int l = 0; l < o.n_layers; l++) with_store |= o.store_layer[l];
    if (with_store && !o.store_uid) {
        errno = 0;
        die("launch: --store-layer needs --store-uid");
    }
    start_namespaces(&ns, &o, with_store);
    private_mount_namespace();
    clone_layers(&o, layer_fds);
    start_root(&o, "sandrl");
    stage_for_bwrap(&o);
    finish_namespaces(&ns, &o, with_store);
    finish_root(&o, layer_fds, &ns);
    close(enter_network_namespace(&ns.sandbox));
    if (ns.store_fd >= 0) close(ns.store_fd);

    /* The agent binary goes in as an open file: nothing of the host shows in the sandbox's tree. */
    int self_fd = open("/proc/self/exe", O_RDONLY);
    if (self_fd < 0) die("open /proc/self/exe");

    become_sandbox_uid(o.uid);

    char **args = calloc((size_t)o.n_rest + 4, sizeof(char *));
    char userns_str[16], inner_str[16], self_path[40];
    snprintf(userns_str, sizeof userns_str, "%d", ns.userns_fd);
    snprintf(inner_str, sizeof inner_str, "%d", ns.inner_fd);
    snprintf(self_path, sizeof self_path, "/proc/self/fd/%d", self_fd);
    int k = 0;
    args[k++] = (char *)o.bwrap;
    args[k++] = "--userns";
    args[k++] = userns_str;
    for (int j = 0; j < o.n_rest; j++)
        args[k++] = !strcmp(o.rest[j], "@AGENT@")          ? self_path
                    : !strcmp(o.rest[j], "@INNER_USERNS@") ? inner_str
                                                           : o.rest[j];
    args[k] = NULL;
    reap_children();
    execv(o.bwrap, args);
    die("exec %s", o.bwrap);
    return 70;
}

/* ---------------------------------------------------------------- agent */

enum {
    REQ_EXEC = 1,
    REQ_STDIN = 2,
    REQ_SIGNAL = 3,
    REQ_WOPEN = 4,
    REQ_WDATA = 5,
    REQ_WCLOSE = 6,
    REQ_READ = 7,
    REQ_TTL = 8,
    REQ_PING = 9,
    REQ_PAUSE = 10,
    RSP_HELLO = 101,
    RSP_STARTED = 102,
    RSP_STDOUT = 103,
    RSP_STDERR = 104,
    RSP_EXIT = 105,
    RSP_OK = 106,
    RSP_FAIL = 107,
    RSP_DATA = 108,
    RSP_END = 109,
    RSP_PONG = 110,
};

#define HDR 9
#define MAX_FRAME (16u << 20)
#define MAX_PROCS 4096
#define MAX_FILES 256
#define MAX_DRAIN 4096
#define CHUNK 65536
#define OUT_HIGH (1u << 20) /* stop reading children's pipes while this much waits for the socket */
#define STDIN_MAX (64u << 20) /* stdin queued for a child that does not read it; beyond, stdin closes */

struct proc {
    uint32_t id;
    pid_t pid;
    int fds[2]; /* stdout, stderr read ends; -1 once closed */
    int in_fd;
    unsigned char *inq; /* stdin not yet taken by the child */
    size_t inq_len, inq_off;
    int in_eof;
    uint64_t sent[2];
    uint64_t cap;
    int truncated;
    int64_t deadline_ms; /* 0 = none */
    int64_t start_us;
    int exited, status, timed_out, used;
    int paused; /* the provider's reader is behind: leave the pipes unread, so the command blocks */
};

struct wfile {
    uint32_t id;
    int fd, err, used;
    char *path; /* removed if the write fails: a cut upload leaves no partial file filling the disk */
};

struct rfile {
    uint32_t id;
    int fd, used;
    uint64_t left;
};

static struct proc procs[MAX_PROCS];
/* One past the highest slot of `procs` in use: the loops over the commands (several per poll
 * round) stop there, not at MAX_PROCS (~450 KiB of slots, which a sandbox running one command
 * would otherwise read through, and fault in, on every request). */
static int procs_hi;
static struct wfile wfiles[MAX_FILES];
static struct rfile rfiles[MAX_FILES];
static int drain_fds[MAX_DRAIN];
static int n_drain;
static int ctl = -1;
static unsigned char *outbuf;
static size_t out_len, out_cap, out_off;
static unsigned char *inbuf;
static size_t in_len, in_cap;
static int64_t ttl_deadline_ms;

static void out_reserve(size_t extra) {
    if (out_off && out_off == out_len) out_off = out_len = 0;
    if (out_len + extra <= out_cap) return;
    if (out_off) {
        memmove(outbuf, outbuf + out_off, out_len - out_off);
        out_len -= out_off;
        out_off = 0;
        if (out_len + extra <= out_cap) return;
    }
    size_t want = out_cap ? out_cap : 65536;
    while (want < out_len + extra) want *= 2;
    unsigned char *p = realloc(outbuf, want);
    if (!p) _exit(71);
    outbuf = p;
    out_cap = want;
}

static void send_frame(uint8_t type, uint32_t id, const void *payload, size_t len) {
    out_reserve(HDR + len);
    unsigned char *p = outbuf + out_len;
    put_u32(p, (uint32_t)len);
    p[4] = type;
    put_u32(p + 5, id);
    if (len) memcpy(p + HDR, payload, len);
    out_len += HDR + len;
}

/* A file pid 1 may read or write for the provider: a regular file, not on /proc or /sys (pid 1
 * would otherwise read its own memory or write its own settings for whoever planted the path).
 * Returns 0, or an errno with `why` set. */
static int servable_file(int fd, const char **why) {
    struct stat st;
    struct statfs fs;
    if (fstat(fd, &st) != 0 || fstatfs(fd, &fs) != 0) {
        *why = "cannot stat it";
        return errno;
    }
    if (S_ISDIR(st.st_mode)) {
        *why = strerror(EISDIR);
        return EISDIR;
    }
    if (!S_ISREG(st.st_mode)) {
        *why = "it is not a regular file (a FIFO, device or socket); read it with a command";
        return EINVAL;
    }
    if (fs.f_type == PROC_SUPER_MAGIC || fs.f_type == SYSFS_MAGIC) {
        *why = "files under /proc and /sys are not served; read them with a command";
        return EPERM;
    }
    return 0;
}

/* FAIL: u32 errno, then "<what>: <why>". */
static void send_fail_why(uint32_t id, int err, const char *what, const char *why) {
    char msg[1024];
    int n = snprintf(msg + 4, sizeof msg - 4, "%s: %s", what, why);
    if (n < 0) n = 0;
    if (n > (int)sizeof msg - 5) n = (int)sizeof msg - 5;
    put_u32((unsigned char *)msg, (uint32_t)err);
    send_frame(RSP_FAIL, id, msg, (size_t)n + 4);
}

static void send_fail(uint32_t id, int err, const char *what) { send_fail_why(id, err, what, strerror(err)); }

static void flush_out(int blocking) {
    while (out_off < out_len) {
        ssize_t n = send(ctl, outbuf + out_off, out_len - out_off, MSG_NOSIGNAL | (blocking ? 0 : MSG_DONTWAIT));
        if (n > 0) {
            out_off += (size_t)n;
            continue;
        }
        if (n < 0 && errno == EINTR) continue;
        if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK) && !blocking) return;
        _exit(0); /* the provider is gone */
    }
    out_off = out_len = 0;
}

static size_t out_pending(void) { return out_len - out_off; }

static void set_nonblock(int fd) { fcntl(fd, F_SETFL, fcntl(fd, F_GETFL) | O_NONBLOCK); }

/* Stop every process descended from root, then kill them all: stopped processes cannot
 * fork, so the tree cannot grow while it is being killed. The exec's main process is a
 * child subreaper, so orphans of its tree stay under it and are found too. */
static void kill_tree(pid_t root, int sig) {
    static pid_t marked[8192];
    int n_marked = 0;
    if (sig != SIGKILL) {
        kill(-root, sig);
        kill(root, sig);
        return;
    }
    kill(root, SIGSTOP);
    marked[n_marked++] = root;
    for (int round = 0; round < 64; round++) {
        static pid_t pids[32768], ppids[32768];
        int n = 0;
        DIR *d = opendir("/proc");
        if (!d) break;
        struct dirent *e;
        while ((e = readdir(d)) && n < 32768) {
            if (e->d_name[0] < '0' || e->d_name[0] > '9') continue;
            char path[300], buf[512];
            snprintf(path, sizeof path, "/proc/%s/stat", e->d_name);
            int fd = open(path, O_RDONLY | O_CLOEXEC);
            if (fd < 0) continue;
            ssize_t r = read(fd, buf, sizeof buf - 1);
            close(fd);
            if (r <= 0) continue;
            buf[r] = 0;
            char *rp = strrchr(buf, ')');
            if (!rp) continue;
            char state;
            int ppid;
            if (sscanf(rp + 2, "%c %d", &state, &ppid) != 2) continue;
            pids[n] = atoi(e->d_name);
            ppids[n++] = ppid;
        }
        closedir(d);
        int added = 0;
        for (int changed = 1; changed;) {
            changed = 0;
            for (int a = 0; a < n; a++) {
                int is_marked = 0, parent_marked = 0;
                for (int b = 0; b < n_marked; b++) {
                    if (marked[b] == pids[a]) is_marked = 1;
                    if (marked[b] == ppids[a]) parent_marked = 1;
                }
                if (!is_marked && parent_marked && n_marked < 8192) {
                    kill(pids[a], SIGSTOP);
                    marked[n_marked++] = pids[a];
                    changed = added = 1;
                }
            }
        }
        if (!added) break;
    }
    kill(-root, SIGKILL);
    for (int b = 0; b < n_marked; b++) kill(marked[b], SIGKILL);
}

static struct proc *find_proc(uint32_t id) {
    for (int i = 0; i < procs_hi; i++)
        if (procs[i].used && procs[i].id == id) return &procs[i];
    return NULL;
}

static void close_fd(int *fd) {
    if (*fd >= 0) close(*fd);
    *fd = -1;
}

static void finish_proc(struct proc *p) {
    unsigned char msg[4 + 1 + 1 + 8];
    int code;
    if (p->timed_out)
        code = 124;
    else if (WIFEXITED(p->status))
        code = WEXITSTATUS(p->status);
    else if (WIFSIGNALED(p->status))
        code = -WTERMSIG(p->status);
    else
        code = -1;
    put_u32(msg, (uint32_t)code);
    msg[4] = (unsigned char)p->timed_out;
    msg[5] = (unsigned char)p->truncated;
    uint64_t dur = (uint64_t)(now_us() - p->start_us);
    for (int i = 0; i < 8; i++) msg[6 + i] = (dur >> (8 * i)) & 0xff;
    send_frame(RSP_EXIT, p->id, msg, sizeof msg);
    close_fd(&p->in_fd);
    free(p->inq);
    memset(p, 0, sizeof *p);
    while (procs_hi > 0 && !procs[procs_hi - 1].used) procs_hi--;
}

/* Read what a child wrote; returns 0 on EOF, 1 if the pipe is still open. */
static int pump_pipe(struct proc *p, int which) {
    unsigned char buf[CHUNK];
    for (;;) {
        ssize_t n = read(p->fds[which], buf, sizeof buf);
        if (n > 0) {
            uint64_t room = p->sent[which] < p->cap ? p->cap - p->sent[which] : 0;
            size_t take = (uint64_t)n < room ? (size_t)n : (size_t)room;
            if (take) send_frame(which ? RSP_STDERR : RSP_STDOUT, p->id, buf, take);
            if (take < (size_t)n) p->truncated = 1;
            p->sent[which] += take;
            if (out_pending() > OUT_HIGH && !p->exited) return 1;
            continue;
        }
        if (n == 0) {
            close_fd(&p->fds[which]);
            return 0;
        }
        if (errno == EINTR) continue;
        return 1; /* EAGAIN */
    }
}

/* The main process exited: take what is already in the pipes, and if background
 * processes still hold them, keep reading (and dropping) so they never block or die of
 * SIGPIPE, but do not wait for them. */
static void complete_if_done(struct proc *p) {
    if (!p->exited) return;
    for (int w = 0; w < 2; w++) {
        if (p->fds[w] >= 0 && pump_pipe(p, w)) {
            if (n_drain < MAX_DRAIN)
                drain_fds[n_drain++] = p->fds[w];
            else
                close(p->fds[w]);
            p->fds[w] = -1;
        }
    }
    finish_proc(p);
}

static const char *take_str(const unsigned char **p, const unsigned char *end, uint32_t *len) {
    if (end - *p < 4) return NULL;
    *len = get_u32(*p);
    *p += 4;
    if ((uint64_t)(end - *p) < *len) return NULL;
    const char *s = (const char *)*p;
    *p += *len;
    return s;
}

/* ---------------------------------------------------------------- the sandbox's processes
 *
 * Pid 1 is root of the outer user namespace that bubblewrap entered (host uid U). Every
 * command runs in a nested user namespace whose root is host uid U+1: pid 1's uid is not
 * mapped there, so the sandbox's root has no capability over pid 1 (no signals, ptrace,
 * prlimit, renice, taskset, /proc/1/oom_score_adj...), only the capabilities Docker gives a
 * container's root over its own processes, and a seccomp filter on top. */

static int inner_userns = -1; /* made by the launcher, with the network namespace pid 1 is in */

/* Capabilities to drop from a command's bounding set, which entering a user namespace resets to
 * all: those outside pid 1's own (bubblewrap left it exactly provider.py's DEFAULT_CAPS). Read once. */
static int dropped_caps[64], n_dropped_caps;

static void read_dropped_caps(void) {
    for (int c = 0; c < 64; c++) {
        int has = prctl(PR_CAPBSET_READ, c, 0, 0, 0);
        if (has < 0) break; /* past the kernel's last capability */
        if (!has) dropped_caps[n_dropped_caps++] = c;
    }
}

/* Pid 1 reads and writes files for the provider as the sandbox's root (so what it creates is
 * owned by root inside), keeping its file capabilities, which a change of fsuid drops. */
static void act_as_sandbox_root_for_files(void) {
    setfsgid(1);
    setfsuid(1);
    struct __user_cap_header_struct h = {_LINUX_CAPABILITY_VERSION_3, 0};
    struct __user_cap_data_struct d[2];
    if (syscall(SYS_capget, &h, d) == 0) {
        d[0].effective = d[0].permitted;
        d[1].effective = d[1].permitted;
        (void)!syscall(SYS_capset, &h, d);
    }
}

#if defined(__x86_64__)
#define SANDRL_AUDIT_ARCH AUDIT_ARCH_X86_64
#elif defined(__aarch64__)
#define SANDRL_AUDIT_ARCH AUDIT_ARCH_AARCH64
#else
#error "sandrl-helper: no seccomp architecture for this CPU"
#endif

/* Refused outright (EPERM), after Docker's default profile: kernel keyrings, kexec, BPF,
 * perf, userfaultfd, io_uring, module loading, swap, accounting, quotas, reboot, the kernel
 * log, raw port I/O and file handles. Namespaces (unshare, clone, setns, mount inside a nested
 * user namespace) stay allowed: see the threat model in provider.py. */
static const int denied_syscalls[] = {
#ifdef SYS_keyctl
    SYS_keyctl,
#endif
#ifdef SYS_add_key
    SYS_add_key,
#endif
#ifdef SYS_request_key
    SYS_request_key,
#endif
#ifdef SYS_kexec_load
    SYS_kexec_load,
#endif
#ifdef SYS_kexec_file_load
    SYS_kexec_file_load,
#endif
#ifdef SYS_bpf
    SYS_bpf,
#endif
#ifdef SYS_perf_event_open
    SYS_perf_event_open,
#endif
#ifdef SYS_userfaultfd
    SYS_userfaultfd,
#endif
#ifdef SYS_io_uring_setup
    SYS_io_uring_setup,
#endif
#ifdef SYS_io_uring_enter
    SYS_io_uring_enter,
#endif
#ifdef SYS_io_uring_register
    SYS_io_uring_register,
#endif
#ifdef SYS_init_module
    SYS_init_module,
#endif
#ifdef SYS_finit_module
    SYS_finit_module,
#endif
#ifdef SYS_delete_module
    SYS_delete_module,
#endif
#ifdef SYS_swapon
    SYS_swapon,
#endif
#ifdef SYS_swapoff
    SYS_swapoff,
#endif
#ifdef SYS_acct
    SYS_acct,
#endif
#ifdef SYS_quotactl
    SYS_quotactl,
#endif
#ifdef SYS_quotactl_fd
    SYS_quotactl_fd,
#endif
#ifdef SYS_reboot
    SYS_reboot,
#endif
#ifdef SYS_syslog
    SYS_syslog,
#endif
#ifdef SYS_iopl
    SYS_iopl,
#endif
#ifdef SYS_ioperm
    SYS_ioperm,
#endif
#ifdef SYS_open_by_handle_at
    SYS_open_by_handle_at,
#endif
#ifdef SYS_lookup_dcookie
    SYS_lookup_dcookie,
#endif
#ifdef SYS_uselib
    SYS_uselib,
#endif
#ifdef SYS_fanotify_init
    SYS_fanotify_init,
#endif
};

/* Refused when they name pid 1 (argument `arg`): belt and braces over the uid barrier. */
static const struct {
    int nr, arg;
} pid1_rules[] = {
    {SYS_ptrace, 1},         {SYS_process_vm_readv, 0}, {SYS_process_vm_writev, 0}, {SYS_prlimit64, 0},
    {SYS_sched_setaffinity, 0}, {SYS_sched_setscheduler, 0}, {SYS_sched_setparam, 0}, {SYS_setpriority, 1},
    {SYS_ioprio_set, 1},     {SYS_migrate_pages, 0},     {SYS_move_pages, 0},
#ifdef SYS_pidfd_open
    {SYS_pidfd_open, 0},
#endif
#ifdef SYS_sched_setattr
    {SYS_sched_setattr, 0},
#endif
};

/* The filter pid 1 installs on itself once, and so every command inherits: installing one costs
 * ~1 us per instruction (the kernel compiles it), so it is short: one jump per syscall named,
 * and one shared argument check per argument position. */
#define N_DENIED (sizeof denied_syscalls / sizeof denied_syscalls[0])
#define N_PID1_RULES (sizeof pid1_rules / sizeof pid1_rules[0])
static struct sock_filter seccomp_filter[8 + N_DENIED + N_PID1_RULES + 11];
static struct sock_fprog seccomp_prog;

static void build_seccomp(void) {
    struct sock_filter *f = seccomp_filter;
    unsigned n = 0;
    const uint32_t eperm = SECCOMP_RET_ERRNO | (EPERM & SECCOMP_RET_DATA);
    const uint32_t enosys = SECCOMP_RET_ERRNO | (ENOSYS & SECCOMP_RET_DATA);
#define S(code, k) f[n++] = (struct sock_filter)BPF_STMT(code, k)
#define J(code, k, jt, jf)                                                   \
    do {                                                                     \
        struct sock_filter ins_ = (struct sock_filter)BPF_JUMP(code, k, jt, jf); \
        f[n++] = ins_; /* jt/jf read n first: TO() is relative to this one */ \
    } while (0)
#define TO(target) ((uint8_t)((target) - (n + 1))) /* a forward jump from the instruction being added */
    const uint32_t nr = offsetof(struct seccomp_data, nr);
    S(BPF_LD | BPF_W | BPF_ABS, offsetof(struct seccomp_data, arch));
    J(BPF_JMP | BPF_JEQ | BPF_K, SANDRL_AUDIT_ARCH, 1, 0);
    S(BPF_RET | BPF_K, enosys); /* another ABI (i386, arm32) would dodge the numbers below */
    S(BPF_LD | BPF_W | BPF_ABS, nr);
#if defined(__x86_64__)
    J(BPF_JMP | BPF_JGE | BPF_K, 0x40000000u, 0, 1); /* the x32 ABI: same reason */
    S(BPF_RET | BPF_K, enosys);
#endif
    /* Layout: the jumps, ALLOW, one 4-instruction check of "argument == 1" per argument
     * position (0 and 1), ALLOW, EPERM. */
    const unsigned allow = n + (unsigned)(N_DENIED + N_PID1_RULES);
    const unsigned check[2] = {allow + 1, allow + 5};
    const unsigned allow_after_check = allow + 9, deny = allow + 10;
    for (size_t i = 0; i < N_DENIED; i++) J(BPF_JMP | BPF_JEQ | BPF_K, (uint32_t)denied_syscalls[i], TO(deny), 0);
    for (int arg = 0; arg < 2; arg++)
        for (size_t i = 0; i < N_PID1_RULES; i++)
            if (pid1_rules[i].arg == arg) J(BPF_JMP | BPF_JEQ | BPF_K, (uint32_t)pid1_rules[i].nr, TO(check[arg]), 0);
    if (n != allow) {
        errno = 0;
        die("seccomp: a pid-1 rule names an argument other than 0 or 1");
    }
    S(BPF_RET | BPF_K, SECCOMP_RET_ALLOW);
    for (int arg = 0; arg < 2; arg++) {
        uint32_t off = offsetof(struct seccomp_data, args) + 8u * (uint32_t)arg;
        S(BPF_LD | BPF_W | BPF_ABS, off); /* low word (little-endian) */
        J(BPF_JMP | BPF_JEQ | BPF_K, 1, 0, TO(allow_after_check));
        S(BPF_LD | BPF_W | BPF_ABS, off + 4);
        J(BPF_JMP | BPF_JEQ | BPF_K, 0, TO(deny), TO(allow_after_check));
    }
    S(BPF_RET | BPF_K, SECCOMP_RET_ALLOW);
    S(BPF_RET | BPF_K, eperm);
#undef TO
#undef S
#undef J
    seccomp_prog = (struct sock_fprog){.len = (unsigned short)n, .filter = seccomp_filter};
}

/* In a command's child, before exec: become the sandbox's root in the nested namespaces, with
 * Docker's capability set at most (no_new_privs and the seccomp filter come from pid 1). */
static int enter_sandbox(void) {
    if (setns(inner_userns, CLONE_NEWUSER)) return -1;
    for (int i = 0; i < n_dropped_caps; i++)
        if (prctl(PR_CAPBSET_DROP, dropped_caps[i], 0, 0, 0)) return -1;
    return setgroups(0, NULL) || setresgid(0, 0, 0) || setresuid(0, 0, 0) ? -1 : 0;
}

/* An argv command's exec, in its child: the program as given when it names a path, else looked up in
 * the command's own PATH (envp's, not pid 1's) as a shell does. No shell runs a file the kernel cannot
 * (ENOEXEC): the caller asked for none. Exits 127 when the program is not there, 126 when it cannot run. */
static void exec_argv(char **argv, char **envp) {
    const char *file = argv[0];
    int err = ENOENT;
    if (strchr(file, '/')) {
        execve(file, argv, envp);
        err = errno;
    } else {
        const char *path = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin";
        for (char **e = envp; *e; e++)
            if (!strncmp(*e, "PATH=", 5)) path = *e + 5;
        int denied = 0;
        size_t flen = strlen(file);
        char buf[PATH_MAX];
        for (const char *dir = path;; dir++) {
            const char *stop = strchrnul(dir, ':');
            size_t dlen = (size_t)(stop - dir);
            if (!dlen) dir = ".", dlen = 1; /* an empty entry is the working directory, as in a shell */
            if (dlen + 1 + flen < sizeof buf) {
                memcpy(buf, dir, dlen);
                buf[dlen] = '/';
                memcpy(buf + dlen + 1, file, flen + 1);
                execve(buf, argv, envp);
                if (errno == EACCES)
                    denied = 1;
                else if (errno != ENOENT && errno != ENOTDIR && errno != ENAMETOOLONG && errno != ELOOP) {
                    err = errno; /* found, and it cannot run: E2BIG, ENOEXEC, ETXTBSY... */
                    break;
                }
            }
            if (!*stop) {
                if (denied) err = EACCES;
                break;
            }
            dir = stop;
        }
    }
    dprintf(2, "sandrl: cannot run %s: %s\n", file, strerror(err));
    _exit(err == ENOENT || err == ENOTDIR ? 127 : 126);
}

/* EXEC: u32 timeout_ms, u32 output cap, u8 flags (1: stdin is piped, 2: an argv, not a shell line),
 * [u32 argc when flags & 2], strings: the working directory, then the shell line (or argc arguments),
 * then the environment as NAME=value. */
static void do_exec(uint32_t id, const unsigned char *pl, uint32_t len) {
    const unsigned char *end = pl + len, *p = pl;
    if (len < 13 || find_proc(id)) {
        send_fail(id, EINVAL, "malformed exec request");
        return;
    }
    uint32_t timeout_ms = get_u32(p);
    uint32_t cap = get_u32(p + 4);
    uint8_t flags = p[8];
    uint32_t argc = 1; /* the shell line */
    p += 9;
    if (flags & 2) {
        if (len < 17) {
            send_fail(id, EINVAL, "malformed exec request");
            return;
        }
        argc = get_u32(p);
        p += 4;
    }
    uint32_t nstr = get_u32(p);
    p += 4;
    if (nstr < 2 || nstr > 65536 || argc < 1 || argc > nstr - 1) {
        send_fail(id, EINVAL, "malformed exec request");
        return;
    }
    char **strs = calloc(nstr + 1, sizeof(char *));
    for (uint32_t i = 0; i < nstr; i++) {
        uint32_t sl;
        const char *s = take_str(&p, end, &sl);
        if (!s || memchr(s, 0, sl)) { /* a NUL would cut a string short without a word */
            for (uint32_t j = 0; j < i; j++) free(strs[j]);
            free(strs);
            send_fail(id, EINVAL, "malformed exec request");
            return;
        }
        strs[i] = strndup(s, sl);
    }
    char **argv = NULL; /* an argv command's, NULL-terminated (in strs the environment follows it) */
    if (flags & 2) {
        argv = calloc(argc + 1, sizeof(char *));
        memcpy(argv, strs + 1, argc * sizeof(char *));
    }
    char **envp = strs + 1 + argc;
    struct proc *slot = NULL;
    for (int i = 0; i < MAX_PROCS; i++)
        if (!procs[i].used) {
            slot = &procs[i];
            break;
        }
    int outp[2] = {-1, -1}, errp[2] = {-1, -1}, inp[2] = {-1, -1};
    int ok = slot && !pipe2(outp, O_CLOEXEC) && !pipe2(errp, O_CLOEXEC);
    if (ok && (flags & 1)) ok = !pipe2(inp, O_CLOEXEC);
    pid_t pid = -1;
    if (ok) pid = fork();
    if (pid == 0) {
        sigset_t all;
        sigemptyset(&all);
        sigprocmask(SIG_SETMASK, &all, NULL);
        for (int s = 1; s < NSIG; s++) signal(s, SIG_DFL);
        setsid();
        prctl(PR_SET_CHILD_SUBREAPER, 1);
        int devnull = open("/dev/null", O_RDWR);
        dup2(inp[0] >= 0 ? inp[0] : devnull, 0);
        dup2(outp[1], 1);
        dup2(errp[1], 2);
        if (enter_sandbox() != 0) {
            dprintf(2, "sandrl: cannot enter the sandbox's namespaces: %s\n", strerror(errno));
            _exit(126);
        }
        if (chdir(strs[0]) != 0) {
            dprintf(2, "sandrl: cannot use %s as the working directory: %s\n", strs[0], strerror(errno));
            _exit(1);
        }
        if (argv) exec_argv(argv, envp);
        char *shell[] = {"sh", "-c", strs[1], NULL};
        execve("/bin/sh", shell, envp);
        dprintf(2, "sandrl: cannot run /bin/sh in this image: %s\n", strerror(errno));
        _exit(127);
    }
    int err = errno;
    close_fd(&outp[1]);
    close_fd(&errp[1]);
    close_fd(&inp[0]);
    for (uint32_t i = 0; i < nstr; i++) free(strs[i]);
    free(strs);
    free(argv);
    if (pid < 0) {
        close_fd(&outp[0]);
        close_fd(&errp[0]);
        close_fd(&inp[1]);
        send_fail(id, slot ? err : EAGAIN, slot ? "starting the command" : "too many running commands");
        return;
    }
    memset(slot, 0, sizeof *slot);
    slot->used = 1;
    if (slot - procs >= procs_hi) procs_hi = (int)(slot - procs) + 1;
    slot->id = id;
    slot->pid = pid;
    slot->fds[0] = outp[0];
    slot->fds[1] = errp[0];
    slot->in_fd = inp[1];
    slot->cap = cap;
    slot->start_us = now_us();
    slot->deadline_ms = timeout_ms ? now_ms() + timeout_ms : 0;
    set_nonblock(outp[0]);
    set_nonblock(errp[0]);
    if (inp[1] >= 0) set_nonblock(inp[1]);
    unsigned char pidbuf[4];
    put_u32(pidbuf, (uint32_t)pid);
    send_frame(RSP_STARTED, id, pidbuf, 4);
}

static void drop_stdin(struct proc *p) {
    close_fd(&p->in_fd);
    free(p->inq);
    p->inq = NULL;
    p->inq_len = p->inq_off = 0;
}

/* Feed queued stdin without ever blocking: a child that does not read must not stall pid 1. */
static void flush_stdin(struct proc *p) {
    while (p->in_fd >= 0 && p->inq_off < p->inq_len) {
        ssize_t n = write(p->in_fd, p->inq + p->inq_off, p->inq_len - p->inq_off);
        if (n > 0) {
            p->inq_off += (size_t)n;
        } else if (n < 0 && errno == EINTR) {
            continue;
        } else if (n < 0 && errno == EAGAIN) {
            return;
        } else {
            drop_stdin(p); /* EPIPE: the child closed its stdin */
            return;
        }
    }
    p->inq_len = p->inq_off = 0;
    if (p->in_eof) drop_stdin(p);
}

static void do_stdin(uint32_t id, const unsigned char *pl, uint32_t len) {
    struct proc *p = find_proc(id);
    if (!p || p->in_fd < 0) return; /* the process is gone or took no stdin: drop, as a pipe would */
    if (len == 0) {
        p->in_eof = 1;
        flush_stdin(p);
        return;
    }
    if (p->inq_len - p->inq_off + len > STDIN_MAX) {
        drop_stdin(p);
        return;
    }
    if (p->inq_off) {
        memmove(p->inq, p->inq + p->inq_off, p->inq_len - p->inq_off);
        p->inq_len -= p->inq_off;
        p->inq_off = 0;
    }
    unsigned char *q = realloc(p->inq, p->inq_len + len);
    if (!q) _exit(71);
    p->inq = q;
    memcpy(p->inq + p->inq_len, pl, len);
    p->inq_len += len;
    flush_stdin(p);
}

static int mkdirs_for(char *path) {
    for (char *s = path + 1; *s; s++) {
        if (*s != '/') continue;
        *s = 0;
        int r = mkdir(path, 0755);
        *s = '/';
        if (r != 0 && errno != EEXIST) return -1;
    }
    return 0;
}

static struct wfile *find_wfile(uint32_t id) {
    for (int i = 0; i < MAX_FILES; i++)
        if (wfiles[i].used && wfiles[i].id == id) return &wfiles[i];
    return NULL;
}

static void do_wopen(uint32_t id, const unsigned char *pl, uint32_t len) {
    if (len < 5) {
        send_fail(id, EINVAL, "malformed write request");
        return;
    }
    uint32_t mode = get_u32(pl) & 07777;
    char *path = strndup((const char *)pl + 4, len - 4);
    struct wfile *w = NULL;
    for (int i = 0; i < MAX_FILES; i++)
        if (!wfiles[i].used) {
            w = &wfiles[i];
            break;
        }
    if (!w) {
        send_fail(id, EMFILE, "too many files open for writing");
        free(path);
        return;
    }
    int fd = -1;
    /* O_NONBLOCK: opening a FIFO planted at the path must not stall pid 1; no O_TRUNC until the
     * file is known to be a regular one. */
    if (mkdirs_for(path) == 0) fd = open(path, O_WRONLY | O_CREAT | O_CLOEXEC | O_NONBLOCK | O_NOCTTY, mode);
    if (fd < 0) {
        send_fail(id, errno, path);
        free(path);
        return;
    }
    const char *why = NULL;
    int bad = servable_file(fd, &why);
    if (!bad && ftruncate(fd, 0) != 0) {
        bad = errno;
        why = "cannot truncate it";
    }
    if (bad) {
        close(fd);
        send_fail_why(id, bad, path, why);
        free(path);
        return;
    }
    fchmod(fd, mode);
    w->used = 1;
    w->id = id;
    w->fd = fd;
    w->err = 0;
    w->path = path;
    send_frame(RSP_OK, id, NULL, 0);
}

static void do_wdata(uint32_t id, const unsigned char *pl, uint32_t len) {
    struct wfile *w = find_wfile(id);
    if (!w || w->err) return;
    size_t off = 0;
    while (off < len) {
        ssize_t n = write(w->fd, pl + off, len - off);
        if (n > 0)
            off += (size_t)n;
        else if (n < 0 && errno == EINTR)
            continue;
        else {
            /* Say so at once (a full disk must stop the upload now, not after the rest of it has
             * crossed the host); the close that follows gets no second answer. */
            w->err = n < 0 ? errno : EIO;
            send_fail(id, w->err, "writing the file");
            break;
        }
    }
}

static void do_wclose(uint32_t id) {
    struct wfile *w = find_wfile(id);
    if (!w) {
        send_fail(id, EBADF, "no file open for this write");
        return;
    }
    int err = w->err, reported = err != 0;
    if (close(w->fd) != 0 && !err) err = errno;
    if (err) unlink(w->path);
    free(w->path);
    memset(w, 0, sizeof *w);
    if (reported) return;
    if (err)
        send_fail(id, err, "writing the file");
    else
        send_frame(RSP_OK, id, NULL, 0);
}

/* READ: u64 offset, u64 most bytes, path. The provider reads big files window by window,
 * so memory on both sides stays bounded however slowly the data is consumed. */
static void do_read(uint32_t id, const unsigned char *pl, uint32_t len) {
    if (len < 17) {
        send_fail(id, EINVAL, "malformed read request");
        return;
    }
    uint64_t offset = (uint64_t)get_u32(pl) | ((uint64_t)get_u32(pl + 4) << 32);
    uint64_t most = (uint64_t)get_u32(pl + 8) | ((uint64_t)get_u32(pl + 12) << 32);
    char *path = strndup((const char *)pl + 16, len - 16);
    struct rfile *r = NULL;
    for (int i = 0; i < MAX_FILES; i++)
        if (!rfiles[i].used) {
            r = &rfiles[i];
            break;
        }
    if (!r) {
        send_fail(id, EMFILE, "too many files open for reading");
        free(path);
        return;
    }
    int fd = open(path, O_RDONLY | O_CLOEXEC | O_NONBLOCK | O_NOCTTY);
    const char *why = NULL;
    int bad = fd >= 0 ? servable_file(fd, &why) : 0;
    if (bad) {
        close(fd);
        send_fail_why(id, bad, path, why);
        free(path);
        return;
    }
    if (fd >= 0 && offset && lseek(fd, (off_t)offset, SEEK_SET) < 0) {
        int e = errno;
        close(fd);
        fd = -1;
        errno = e;
    }
    if (fd < 0) {
        send_fail(id, errno, path);
        free(path);
        return;
    }
    free(path);
    r->used = 1;
    r->id = id;
    r->fd = fd;
    r->left = most;
}

static void pump_reads(void) {
    unsigned char buf[CHUNK];
    for (int i = 0; i < MAX_FILES; i++) {
        struct rfile *r = &rfiles[i];
        while (r->used && out_pending() < OUT_HIGH) {
            size_t want = r->left < sizeof buf ? (size_t)r->left : sizeof buf;
            ssize_t n = want ? read(r->fd, buf, want) : 0;
            if (n > 0) {
                send_frame(RSP_DATA, r->id, buf, (size_t)n);
                r->left -= (uint64_t)n;
                continue;
            }
            if (n < 0 && errno == EINTR) continue;
            if (n < 0)
                send_fail(r->id, errno, "reading the file");
            else
                send_frame(RSP_END, r->id, NULL, 0);
            close(r->fd);
            memset(r, 0, sizeof *r);
        }
    }
}

static void handle_frame(uint8_t type, uint32_t id, const unsigned char *pl, uint32_t len) {
    switch (type) {
    case REQ_EXEC:
        do_exec(id, pl, len);
        break;
    case REQ_STDIN:
        do_stdin(id, pl, len);
        break;
    case REQ_SIGNAL: {
        struct proc *p = find_proc(id);
        if (p && !p->exited && len >= 4) kill_tree(p->pid, (int)get_u32(pl));
        break;
    }
    case REQ_WOPEN:
        do_wopen(id, pl, len);
        break;
    case REQ_WDATA:
        do_wdata(id, pl, len);
        break;
    case REQ_WCLOSE:
        do_wclose(id);
        break;
    case REQ_READ:
        do_read(id, pl, len);
        break;
    case REQ_TTL:
        if (len >= 4) {
            uint32_t ms = get_u32(pl);
            ttl_deadline_ms = ms ? now_ms() + ms : 0;
        }
        send_frame(RSP_OK, id, NULL, 0);
        break;
    case REQ_PING:
        send_frame(RSP_PONG, id, NULL, 0);
        break;
    case REQ_PAUSE: {
        struct proc *p = find_proc(id);
        if (p && len >= 4) p->paused = get_u32(pl) != 0;
        break;
    }
    default:
        send_fail(id, ENOSYS, "unknown request type");
    }
}

static void read_ctl(void) {
    if (in_cap - in_len < CHUNK) {
        size_t want = in_cap ? in_cap * 2 : 2 * CHUNK;
        unsigned char *p = realloc(inbuf, want);
        if (!p) _exit(71);
        inbuf = p;
        in_cap = want;
    }
    ssize_t n = recv(ctl, inbuf + in_len, in_cap - in_len, MSG_DONTWAIT);
    if (n == 0) _exit(0); /* the provider closed us or died: everything goes with pid 1 */
    if (n < 0) {
        if (errno == EAGAIN || errno == EINTR) return;
        _exit(0);
    }
    in_len += (size_t)n;
    size_t off = 0;
    while (in_len - off >= HDR) {
        uint32_t len = get_u32(inbuf + off);
        if (len > MAX_FRAME) _exit(72);
        if (in_len - off < HDR + len) {
            if (in_cap < HDR + len) {
                unsigned char *p = realloc(inbuf, HDR + len + CHUNK);
                if (!p) _exit(71);
                inbuf = p;
                in_cap = HDR + len + CHUNK;
            }
            break;
        }
        handle_frame(inbuf[off + 4], get_u32(inbuf + off + 5), inbuf + off + HDR, len);
        off += HDR + len;
    }
    memmove(inbuf, inbuf + off, in_len - off);
    in_len -= off;
}

static void reap(void) {
    int status;
    pid_t pid;
    while ((pid = waitpid(-1, &status, WNOHANG)) > 0) {
        for (int i = 0; i < procs_hi; i++) {
            if (procs[i].used && procs[i].pid == pid && !procs[i].exited) {
                procs[i].exited = 1;
                procs[i].status = status;
                complete_if_done(&procs[i]);
                break;
            }
        }
    }
}

/* Close every fd above 2 but the three kept (-1: none): close_range over the gaps between them,
 * three syscalls where a walk of /proc/self/fd (a directory listing through procfs) took ~30. */
static int close_fds_but(int keep1, int keep2, int keep3) {
#ifdef SYS_close_range
    int keep[3] = {keep1, keep2, keep3};
    for (int i = 0; i < 3; i++)
        for (int j = i + 1; j < 3; j++)
            if (keep[j] < keep[i]) {
                int t = keep[i];
                keep[i] = keep[j];
                keep[j] = t;
            }
    unsigned int lo = 3;
    for (int i = 0; i < 3; i++) {
        if (keep[i] < (int)lo) continue;
        if ((unsigned int)keep[i] > lo && syscall(SYS_close_range, lo, (unsigned int)keep[i] - 1, 0)) return -1;
        lo = (unsigned int)keep[i] + 1;
    }
    return (int)syscall(SYS_close_range, lo, ~0U, 0);
#else
    (void)keep1, (void)keep2, (void)keep3;
    errno = ENOSYS;
    return -1;
#endif
}

static void close_stray_fds(int keep1, int keep2, int keep3) {
    if (close_fds_but(keep1, keep2, keep3) == 0) return;
    DIR *d = opendir("/proc/self/fd"); /* a kernel before 5.9 */
    if (!d) return;
    int dfd = dirfd(d);
    int fds[1024], n = 0;
    struct dirent *e;
    while ((e = readdir(d)) && n < 1024) {
        if (e->d_name[0] < '0' || e->d_name[0] > '9') continue;
        int fd = atoi(e->d_name);
        if (fd > 2 && fd != keep1 && fd != keep2 && fd != keep3 && fd != dfd) fds[n++] = fd;
    }
    closedir(d);
    for (int i = 0; i < n; i++) close(fds[i]);
}

static int agent_main(int argc, char **argv) {
    const char *workdir = "/";
    int lock_fd = -1;
    uint32_t ttl_ms = 0;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--inner-userns") && i + 1 < argc)
            inner_userns = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--fd") && i + 1 < argc)
            ctl = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--lock-fd") && i + 1 < argc)
            lock_fd = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--workdir") && i + 1 < argc)
            workdir = argv[++i];
        else if (!strcmp(argv[i], "--ttl-ms") && i + 1 < argc)
            ttl_ms = (uint32_t)strtoul(argv[++i], NULL, 10);
    }
    if (ctl < 0 || inner_userns < 0) {
        errno = 0;
        die("agent: need --fd and --inner-userns");
    }
    /* Non-dumpable: nothing in the sandbox may ptrace its supervisor or read its fds. */
    prctl(PR_SET_DUMPABLE, 0);
    close_stray_fds(ctl, lock_fd, inner_userns);
    fcntl(inner_userns, F_SETFD, FD_CLOEXEC);
    if (lock_fd >= 0) fcntl(lock_fd, F_SETFD, FD_CLOEXEC);
    fcntl(ctl, F_SETFD, FD_CLOEXEC);
    read_dropped_caps();
    /* On pid 1 itself, which needs none of what it refuses: commands inherit it at fork. A pid 1 the
     * helper made installed it before its exec (and says so in the only variable of an environment
     * it sets itself); under bubblewrap (--clearenv) the agent installs it here, over whatever
     * filter the host's own may be. */
    char **env = environ;
    int filtered = env && env[0] && !strcmp(env[0], FILTERED_ENV) && !env[1] && prctl(PR_GET_SECCOMP, 0, 0, 0, 0) == 2;
    environ = NULL;
    if (!filtered) {
        build_seccomp();
        if (prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) || prctl(PR_SET_SECCOMP, SECCOMP_MODE_FILTER, &seccomp_prog))
            die("installing the seccomp filter");
    }
    act_as_sandbox_root_for_files();
    int devnull = open("/dev/null", O_RDWR);
    if (devnull >= 0) {
        dup2(devnull, 0);
        dup2(devnull, 1);
        dup2(devnull, 2);
        if (devnull > 2) close(devnull);
    }
    char wd[PATH_MAX];
    snprintf(wd, sizeof wd, "%s/", workdir);
    mkdirs_for(wd);
    if (chdir("/") != 0) _exit(73);
    ttl_deadline_ms = ttl_ms ? now_ms() + ttl_ms : 0;

    sigset_t mask;
    sigemptyset(&mask);
    sigaddset(&mask, SIGCHLD);
    sigaddset(&mask, SIGPIPE);
    sigprocmask(SIG_BLOCK, &mask, NULL);
    sigset_t chld;
    sigemptyset(&chld);
    sigaddset(&chld, SIGCHLD);
    int sfd = signalfd(-1, &chld, SFD_NONBLOCK | SFD_CLOEXEC);
    set_nonblock(ctl);

    unsigned char hello[4];
    put_u32(hello, PROTOCOL_VERSION);
    send_frame(RSP_HELLO, 0, hello, 4);

    static struct pollfd pfds[2 + 3 * MAX_PROCS + MAX_DRAIN];
    static struct proc *owner[2 + 3 * MAX_PROCS + MAX_DRAIN];
    static int which[2 + 3 * MAX_PROCS + MAX_DRAIN];
    for (;;) {
        int n = 0;
        pfds[n] = (struct pollfd){.fd = ctl, .events = POLLIN | (out_pending() ? POLLOUT : 0)};
        owner[n++] = NULL;
        pfds[n] = (struct pollfd){.fd = sfd, .events = POLLIN};
        owner[n++] = NULL;
        int64_t now = now_ms(), wake = ttl_deadline_ms;
        for (int i = 0; i < procs_hi; i++) {
            struct proc *p = &procs[i];
            if (!p->used) continue;
            if (p->deadline_ms && !p->exited) {
                if (now >= p->deadline_ms && !p->timed_out) {
                    p->timed_out = 1;
                    kill_tree(p->pid, SIGKILL);
                } else if (!p->timed_out && (!wake || p->deadline_ms < wake)) {
                    wake = p->deadline_ms;
                }
            }
            if (p->in_fd >= 0 && p->inq_off < p->inq_len) {
                pfds[n] = (struct pollfd){.fd = p->in_fd, .events = POLLOUT};
                owner[n] = p;
                which[n++] = 2;
            }
            /* back-pressure: let the children block (all of them while the socket is full) */
            if (out_pending() > OUT_HIGH || (p->paused && !p->exited)) continue;
            for (int w = 0; w < 2; w++) {
                if (p->fds[w] < 0) continue;
                pfds[n] = (struct pollfd){.fd = p->fds[w], .events = POLLIN};
                owner[n] = p;
                which[n++] = w;
            }
        }
        for (int i = 0; i < n_drain; i++) {
            pfds[n] = (struct pollfd){.fd = drain_fds[i], .events = POLLIN};
            owner[n] = NULL;
            which[n++] = -1 - i;
        }
        int timeout = -1;
        if (wake) timeout = wake > now ? (int)(wake - now) : 0;
        /* A file being read has more to send as soon as the socket has room: don't sleep. */
        for (int i = 0; i < MAX_FILES && timeout != 0; i++)
            if (rfiles[i].used && out_pending() < OUT_HIGH) timeout = 0;
        int r = poll(pfds, (nfds_t)n, timeout);
        if (ttl_deadline_ms && now_ms() >= ttl_deadline_ms) _exit(0); /* TTL: the sandbox ends */
        if (r < 0) {
            if (errno == EINTR) continue;
            _exit(74);
        }
        if (pfds[1].revents) {
            struct signalfd_siginfo si;
            while (read(sfd, &si, sizeof si) == sizeof si) {
            }
            reap();
        }
        for (int i = 2; i < n; i++) {
            if (!pfds[i].revents) continue;
            if (owner[i] && which[i] == 2) {
                if (owner[i]->used && owner[i]->in_fd == pfds[i].fd) flush_stdin(owner[i]);
            } else if (owner[i]) {
                if (owner[i]->used && owner[i]->fds[which[i]] == pfds[i].fd) pump_pipe(owner[i], which[i]);
            } else if (which[i] < 0) {
                int idx = -1 - which[i];
                char junk[CHUNK];
                ssize_t got = read(drain_fds[idx], junk, sizeof junk);
                if (got == 0 || (got < 0 && errno != EAGAIN && errno != EINTR)) {
                    close(drain_fds[idx]);
                    drain_fds[idx] = -1;
                }
            }
        }
        int k = 0;
        for (int i = 0; i < n_drain; i++)
            if (drain_fds[i] >= 0) drain_fds[k++] = drain_fds[i];
        n_drain = k;
        if (pfds[0].revents & (POLLIN | POLLHUP | POLLERR)) read_ctl();
        pump_reads();
        reap();
        flush_out(0);
    }
}

int main(int argc, char **argv) {
    if (argc >= 2 && !strcmp(argv[1], "launch")) return launch_main(argc - 1, argv + 1);
    if (argc >= 2 && !strcmp(argv[1], "agent")) return agent_main(argc - 1, argv + 1);
    fprintf(stderr, "usage: sandrl-helper launch|agent ... (started by sandrl, not by hand)\n");
    return 64;
}
