/* The native load client of bench/stream_load.py (--client native).

   It opens the streams, sends each its request and keeps every read it gets:
   a read costs a recv into one growing log, a clock_gettime and a test of the
   read's last bytes (the chunked body's end closes the stream). Reads are
   edge-triggered (epoll's EPOLLET): a socket is not polled again after a read
   that drained it, only when new data comes. Nothing is
   parsed while the streams run; bench/stream_native.py parses the log once they
   are over, with the Python load's own code, when the server is idle.

   Input (standard input): the request's length in bytes, a newline, the
   request, then one start offset per stream (seconds after the start, text, one
   a line). Arguments: port, deadline in seconds after the start, output path,
   the log's bytes to reserve (touched before the start: a page fault while
   the streams run would cost their CPU; past it the log grows), and the
   quantum in seconds (0: none).

   The quantum: after a wake that found reads, the client sleeps until a
   quantum has passed since it woke, so that the reads of that time are taken
   in one wake. A wake costs two context switches, and beside a server on the
   same CPU (at a real-time priority, which preempts it) many more than the
   reads themselves: at 50,000 tokens/s the client would wake for nearly every
   token. A read is then stamped up to a quantum after it came (0.5 ms by
   default: a fiftieth of the 25 ms bound on the p99 added gap), the same
   for every server.

   Output (the file, native byte order; every double a CLOCK_MONOTONIC time in
   seconds, which is Python's time.perf_counter on Linux):
     "SGC1", uint32 streams, double start, double cpu_s, double wall_s
       (cpu_s: user + system CPU of this process from the start to the last
       stream's end; wall_s: the same span's wall time)
     per stream: double sent_at, int32 state (0 ran, 1 connection failed,
       2 timed out: aborted at the deadline), int32 0
     uint64 log bytes, then per read: int32 stream, int32 length, double time,
       the read's bytes
*/
#define _GNU_SOURCE
#include <errno.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

enum { RAN = 0, FAILED = 1, TIMED_OUT = 2 };
enum { WAITING = 0, CONNECTING = 1, SENDING = 2, READING = 3, OVER = 4 };

typedef struct {
    int fd;
    int phase;
    int state;
    int reads;
    size_t sent;
    double sent_at;
} stream_t;

typedef struct {
    int32_t stream;
    int32_t length;
    double time;
} record_t;

static char *arena;
static size_t used, capacity;
static const char *request;
static size_t request_length;
static size_t open_streams; /* not over yet, started or not */

static double now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec * 1e-9;
}

static double cpu_seconds(void) {
    struct rusage usage;
    getrusage(RUSAGE_SELF, &usage);
    return usage.ru_utime.tv_sec + usage.ru_utime.tv_usec * 1e-6 +
           usage.ru_stime.tv_sec + usage.ru_stime.tv_usec * 1e-6;
}

static void die(const char *what) {
    perror(what);
    exit(2);
}

static void reserve(size_t bytes) {
    if (used + bytes <= capacity) return;
    while (used + bytes > capacity) capacity *= 2;
    arena = realloc(arena, capacity);
    if (arena == NULL) die("realloc");
}

static void finish(int epoll, stream_t *s, int abort) {
    if (abort) {
        struct linger hard = {1, 0}; /* a reset, as asyncio's transport.abort() */
        setsockopt(s->fd, SOL_SOCKET, SO_LINGER, &hard, sizeof hard);
    }
    epoll_ctl(epoll, EPOLL_CTL_DEL, s->fd, NULL);
    close(s->fd);
    s->phase = OVER;
    open_streams--;
}

static void start(int epoll, stream_t *s, int index, int port) {
    struct sockaddr_in to = {.sin_family = AF_INET, .sin_port = htons(port)};
    to.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    int one = 1;
    s->fd = socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK, 0);
    if (s->fd < 0) die("socket");
    setsockopt(s->fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    if (connect(s->fd, (struct sockaddr *)&to, sizeof to) < 0 && errno != EINPROGRESS) {
        close(s->fd);
        s->state = FAILED;
        s->phase = OVER;
        open_streams--;
        return;
    }
    s->phase = CONNECTING;
    struct epoll_event event = {.events = EPOLLOUT, .data.u32 = (uint32_t)index};
    if (epoll_ctl(epoll, EPOLL_CTL_ADD, s->fd, &event) < 0) die("epoll_ctl");
}

static void send_request(int epoll, stream_t *s, int index) {
    if (s->phase == CONNECTING) {
        int error = 0;
        socklen_t size = sizeof error;
        getsockopt(s->fd, SOL_SOCKET, SO_ERROR, &error, &size);
        if (error != 0) {
            finish(epoll, s, 0);
            s->state = FAILED;
            return;
        }
        s->phase = SENDING;
        s->sent_at = now();
    }
    ssize_t wrote = send(s->fd, request + s->sent, request_length - s->sent, MSG_NOSIGNAL);
    if (wrote < 0) {
        if (errno != EAGAIN) finish(epoll, s, 0);
        return;
    }
    s->sent += (size_t)wrote;
    if (s->sent == request_length) {
        struct epoll_event event = {.events = EPOLLIN | EPOLLET, .data.u32 = (uint32_t)index};
        epoll_ctl(epoll, EPOLL_CTL_MOD, s->fd, &event);
        s->phase = READING;
    }
}

/* The reads of one readiness (edge-triggered: until one is short) into the log;
   the stream is over after a refusal's first read or the body's last chunk. */
static void take(int epoll, stream_t *s, int index) {
    enum { MOST = 65536 };
    for (;;) {
        reserve(sizeof(record_t) + MOST);
        char *data = arena + used + sizeof(record_t);
        ssize_t got = recv(s->fd, data, MOST, 0);
        if (got < 0 && (errno == EAGAIN || errno == EINTR)) return;
        if (got <= 0) { /* closed by the server (or reset) */
            finish(epoll, s, 0);
            return;
        }
        record_t record = {index, (int32_t)got, now()};
        memcpy(arena + used, &record, sizeof record);
        used += sizeof record + (size_t)got;
        int first = s->reads++ == 0;
        if ((first && (got < 12 || memcmp(data, "HTTP/1.1 200", 12) != 0)) ||
            (got >= 5 && memcmp(data + got - 5, "0\r\n\r\n", 5) == 0)) {
            finish(epoll, s, 0);
            return;
        }
        if (got < MOST) return; /* drained: the next data is a new edge */
    }
}

static int by_offset_compare(const void *a, const void *b, void *offsets) {
    double x = ((double *)offsets)[*(const int *)a], y = ((double *)offsets)[*(const int *)b];
    return (x > y) - (x < y);
}

int main(int argc, char **argv) {
    if (argc != 6) {
        fprintf(stderr, "usage: stream_client PORT DEADLINE_S OUT RESERVE_BYTES QUANTUM_S < input\n");
        return 2;
    }
    int port = atoi(argv[1]);
    double deadline_s = atof(argv[2]), quantum_s = atof(argv[5]);
    if (scanf("%zu", &request_length) != 1 || getchar() != '\n') die("request length");
    char *buffer = malloc(request_length);
    if (fread(buffer, 1, request_length, stdin) != request_length) die("request");
    request = buffer;
    size_t count = 0, room = 1024;
    double *offsets = malloc(room * sizeof *offsets);
    double offset;
    while (scanf("%lf", &offset) == 1) {
        if (count == room) offsets = realloc(offsets, (room *= 2) * sizeof *offsets);
        offsets[count++] = offset;
    }
    int *order = malloc(count * sizeof *order);
    for (size_t i = 0; i < count; i++) order[i] = (int)i;
    qsort_r(order, count, sizeof *order, by_offset_compare, offsets);
    stream_t *streams = calloc(count, sizeof *streams);
    /* The log's pages are touched before the start, not while the streams run. */
    capacity = strtoull(argv[4], NULL, 10);
    if (capacity < ((size_t)1 << 20)) capacity = (size_t)1 << 20;
    arena = malloc(capacity);
    if (arena == NULL) die("malloc");
    memset(arena, 0, capacity);

    int epoll = epoll_create1(0);
    if (epoll < 0) die("epoll_create1");
    struct epoll_event events[1024];
    double cpu0 = cpu_seconds(), begin = now(), deadline = begin + deadline_s;
    size_t next = 0;
    open_streams = count;
    while (open_streams > 0) {
        double t = now();
        for (; next < count && begin + offsets[order[next]] <= t; next++)
            start(epoll, &streams[order[next]], order[next], port);
        if (t >= deadline) break;
        double until = next < count ? begin + offsets[order[next]] : deadline;
        int wait_ms = (int)((until - t) * 1000.0) + 1;
        int ready = epoll_wait(epoll, events, 1024, wait_ms);
        if (ready < 0 && errno != EINTR) die("epoll_wait");
        double woke = now();
        for (int i = 0; i < ready; i++) {
            int index = (int)events[i].data.u32;
            stream_t *s = &streams[index];
            if (s->phase == READING)
                take(epoll, s, index);
            else if (s->phase != OVER)
                send_request(epoll, s, index);
        }
        if (ready > 0 && quantum_s > 0) { /* let the next reads gather */
            double until = woke + quantum_s, t = now();
            if (next < count && begin + offsets[order[next]] < until)
                until = begin + offsets[order[next]];
            if (t < until) {
                double rest = until - t;
                struct timespec pause = {(time_t)rest, (long)((rest - (time_t)rest) * 1e9)};
                nanosleep(&pause, NULL);
            }
        }
    }
    for (size_t i = 0; i < count; i++)
        if (streams[i].phase != OVER) {
            if (streams[i].phase != WAITING) finish(epoll, &streams[i], 1);
            streams[i].state = TIMED_OUT;
        }
    double cpu_s = cpu_seconds() - cpu0, wall_s = now() - begin;

    FILE *out = fopen(argv[3], "wb");
    if (out == NULL) die("fopen");
    uint32_t n = (uint32_t)count;
    uint64_t log_bytes = used;
    int32_t pad = 0;
    fwrite("SGC1", 1, 4, out);
    fwrite(&n, sizeof n, 1, out);
    fwrite(&begin, sizeof begin, 1, out);
    fwrite(&cpu_s, sizeof cpu_s, 1, out);
    fwrite(&wall_s, sizeof wall_s, 1, out);
    for (size_t i = 0; i < count; i++) {
        int32_t state = streams[i].state;
        fwrite(&streams[i].sent_at, sizeof(double), 1, out);
        fwrite(&state, sizeof state, 1, out);
        fwrite(&pad, sizeof pad, 1, out);
    }
    fwrite(&log_bytes, sizeof log_bytes, 1, out);
    fwrite(arena, 1, used, out);
    if (fclose(out) != 0) die("fclose");
    return 0;
}
