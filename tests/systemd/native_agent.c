/*
 * demo-agent as a native binary: the daemon a host with no Python runs (tests/systemd/test_first_boot.py).
 *
 * The same contract as agent/testing/sample_agent.py, compiled with the version and behaviour baked in:
 *     cc -O2 -DVERSION='"1.0.0"' -DBEHAVIOUR='"good"' -o demo-agent native_agent.c
 *
 *     demo-agent version            prints "demo-agent VERSION" and exits 0
 *     demo-agent serve [--port N]   answers GET /healthz with 200 "ok VERSION" on 127.0.0.1:N until SIGTERM
 *
 * BEHAVIOUR: "good" serves; "unhealthy" answers 503 "unhealthy VERSION"; "exit-after:S" exits 1 after S
 * seconds of serving (a candidate that passes its version check and then dies, case C16).
 *
 * The candidate contract's runtime half (docs/candidate.md, "Socket activation"): when systemd passes a
 * listening socket (LISTEN_PID is this process, LISTEN_FDS >= 1; sd_listen_fds(3), written out here so the
 * binary needs no libsystemd) it serves on fd 3 and ignores --port; otherwise it binds 127.0.0.1:N. SIGTERM
 * lets the request being answered finish, then the process exits 0; connections not yet accepted stay
 * queued in the socket systemd keeps open.
 */
#define _GNU_SOURCE /* accept4(2) */
#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#define SD_LISTEN_FDS_START 3

static volatile sig_atomic_t stopping;

static void stop_accepting(int sig) {
    (void)sig;
    stopping = 1;
}

/* sd_listen_fds(1) without libsystemd: fd 3 when LISTEN_PID is our pid and LISTEN_FDS >= 1, else -1; the
 * variables are unset either way and fd 3 gets FD_CLOEXEC, as sd_listen_fds does. */
static int systemd_socket(void) {
    const char *pid = getenv("LISTEN_PID"), *fds = getenv("LISTEN_FDS");
    int ours = pid && fds && strtol(pid, NULL, 10) == (long)getpid() && strtol(fds, NULL, 10) >= 1;
    unsetenv("LISTEN_PID");
    unsetenv("LISTEN_FDS");
    unsetenv("LISTEN_FDNAMES");
    if (!ours)
        return -1;
    int flags = fcntl(SD_LISTEN_FDS_START, F_GETFD);
    if (flags < 0 || fcntl(SD_LISTEN_FDS_START, F_SETFD, flags | FD_CLOEXEC) < 0)
        return -1;
    return SD_LISTEN_FDS_START;
}

#ifndef VERSION
#define VERSION "0.0.0"
#endif
#ifndef BEHAVIOUR
#define BEHAVIOUR "good"
#endif

static void die_now(int sig) {
    (void)sig;
    static const char msg[] = "demo-agent " VERSION ": failing on purpose\n";
    (void)!write(1, msg, sizeof msg - 1);
    _exit(1);
}

static int serve(int port) {
    int healthy = strcmp(BEHAVIOUR, "unhealthy") != 0;
    int one = 1;
    /* SIGTERM is blocked but while ppoll() waits for a connection: it then interrupts the wait (EINTR) and
     * the loop sees `stopping`; a SIGTERM during a request is handled after it, never in the middle. */
    struct sigaction term;
    sigset_t blocked, waiting;
    memset(&term, 0, sizeof term);
    term.sa_handler = stop_accepting;
    sigaction(SIGTERM, &term, NULL);
    sigemptyset(&blocked);
    sigaddset(&blocked, SIGTERM);
    sigprocmask(SIG_BLOCK, &blocked, &waiting);
    sigdelset(&waiting, SIGTERM);
    int fd = systemd_socket();
    if (fd >= 0) {
        printf("demo-agent %s serving on fd %d from systemd (%s)\n", VERSION, fd, BEHAVIOUR);
    } else {
        struct sockaddr_in addr;
        memset(&addr, 0, sizeof addr);
        addr.sin_family = AF_INET;
        addr.sin_port = htons((unsigned short)port);
        addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
        fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
        if (fd < 0 || setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one) != 0
            || bind(fd, (struct sockaddr *)&addr, sizeof addr) != 0 || listen(fd, 16) != 0) {
            perror("demo-agent: cannot listen");
            return 1;
        }
        printf("demo-agent %s serving on 127.0.0.1:%d (%s)\n", VERSION, port, BEHAVIOUR);
    }
    fflush(stdout);
    if (strncmp(BEHAVIOUR, "exit-after:", 11) == 0) {
        signal(SIGALRM, die_now);
        alarm((unsigned)atoi(BEHAVIOUR + 11));
        if (atoi(BEHAVIOUR + 11) == 0)
            die_now(0);
    }
    while (!stopping) {
        char request[1024], response[256], body[64];
        struct pollfd ready = {.fd = fd, .events = POLLIN};
        if (ppoll(&ready, 1, NULL, &waiting) < 0)
            continue; /* EINTR: a signal; the loop looks at `stopping` */
        /* poll first, then accept: systemd's socket may be non-blocking (EAGAIN when another took it) */
        int conn = accept4(fd, NULL, NULL, SOCK_CLOEXEC);
        if (conn < 0)
            continue;
        ssize_t got = read(conn, request, sizeof request - 1);
        request[got > 0 ? got : 0] = '\0';
        int ok = healthy && strncmp(request, "GET /healthz ", 13) == 0;
        int blen = snprintf(body, sizeof body, "%s %s\n", healthy ? "ok" : "unhealthy", VERSION);
        int rlen = snprintf(response, sizeof response,
                            "HTTP/1.0 %s\r\nContent-Type: text/plain\r\nContent-Length: %d\r\n"
                            "Connection: close\r\n\r\n%s",
                            ok ? "200 OK" : "503 Service Unavailable", blen, body);
        (void)!write(conn, response, (size_t)rlen);
        close(conn);
    }
    close(fd); /* our copy only: the socket systemd holds keeps its queue for the next process */
    return 0;
}

int main(int argc, char **argv) {
    if (argc >= 2 && strcmp(argv[1], "version") == 0) {
        printf("demo-agent %s\n", VERSION);
        return 0;
    }
    if (argc >= 2 && strcmp(argv[1], "serve") == 0) {
        int port = 18080;
        if (argc >= 4 && strcmp(argv[2], "--port") == 0)
            port = atoi(argv[3]);
        return serve(port);
    }
    fprintf(stderr, "usage: demo-agent version | serve [--port N]\n");
    return 2;
}
