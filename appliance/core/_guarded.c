/* A copy that a shrinking file cannot kill: memcpy, with SIGBUS turned into a return value.

   A client's shared-memory segment, mapped, kills the process that touches a
   page past the file's end with SIGBUS, and the client may truncate the file
   at any moment (core/client_memory.py). copy() runs memcpy with a SIGBUS
   handler armed for this thread: a fault there jumps back out of the handler
   and copy() returns False, the copy cut short.

   A fault anywhere else is not ours. The handler passes it, once, to the
   action that was there before ours (faulthandler's, which prints the
   Python stacks), then lets the default action end the process, as it
   would have ended without this module.

   Why C: pread/pwrite on a tmpfs file (the fallback, and what runs where this
   is not built) walk the page cache a page at a time, and took 2-2.5x memcpy's
   time on a 1 MiB tensor; a mapping kept per region copies at memcpy's speed,
   but only code that can return from a signal handler mid-copy makes it safe.

   resident() says whether every page under a view is in memory. A page of
   the file that is not (a hole the client never wrote, or one a truncation
   dropped) is allocated and zeroed by a fault through the mapping, page by
   page, at 10-30x pread's cost for a hole; the caller copies those with
   pread/pwrite instead.

   Each copy first makes sure the handler is still the process's: one that
   faulthandler.enable() (or anything else) installed after ours is moved
   behind it, as the action a foreign fault is passed to. */

#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include <setjmp.h>
#include <signal.h>
#include <stdint.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

/* Set while this thread copies; the handler jumps there. */
static __thread sigjmp_buf *volatile armed = NULL;
/* The action before ours, which a foreign fault is passed to. */
static struct sigaction previous;
static struct sigaction ours;
static volatile sig_atomic_t passing_on = 0;

static void on_bus(int signum, siginfo_t *info, void *context) {
    sigjmp_buf *jump = armed;
    if (jump != NULL && info != NULL && info->si_code > 0) {
        armed = NULL;
        siglongjmp(*jump, 1);
    }
    /* Not a fault of a guarded copy: the default action ends the process,
       after the previous handler (if any, and only once) had its say. */
    struct sigaction fallback;
    memset(&fallback, 0, sizeof(fallback));
    fallback.sa_handler = SIG_DFL;
    sigemptyset(&fallback.sa_mask);
    if (!passing_on && (previous.sa_flags & SA_SIGINFO) && previous.sa_sigaction != on_bus) {
        passing_on = 1;
        sigaction(SIGBUS, &fallback, NULL);
        previous.sa_sigaction(signum, info, context);
    } else if (!passing_on && !(previous.sa_flags & SA_SIGINFO) && previous.sa_handler != SIG_DFL &&
               previous.sa_handler != SIG_IGN) {
        passing_on = 1;
        sigaction(SIGBUS, &fallback, NULL);
        previous.sa_handler(signum);
    }
    sigaction(SIGBUS, &fallback, NULL);
    if (info == NULL || info->si_code <= 0) {
        raise(signum); /* sent, not a fault: returning would lose it */
    }
    /* A fault: returning repeats it, under the default action. */
}

/* Put the handler back in front if another took its place (the caller holds the GIL). */
static void keep_in_front(void) {
    struct sigaction now;
    if (sigaction(SIGBUS, NULL, &now) == 0 && !((now.sa_flags & SA_SIGINFO) && now.sa_sigaction == on_bus)) {
        if (sigaction(SIGBUS, &ours, NULL) == 0) {
            previous = now;
        }
    }
}

/* 1 when all n bytes were copied, 0 when a bus fault cut the copy short. */
static int guarded_memcpy(void *destination, const void *source, size_t n) {
    sigjmp_buf jump;
    /* SA_NODEFER leaves SIGBUS unblocked in the handler, so the jump need not
       restore the signal mask: no sigprocmask call on every copy. */
    if (sigsetjmp(jump, 0) != 0) {
        return 0;
    }
    armed = &jump;
    __atomic_signal_fence(__ATOMIC_SEQ_CST);
    memcpy(destination, source, n);
    __atomic_signal_fence(__ATOMIC_SEQ_CST);
    armed = NULL;
    return 1;
}

/* Above this many bytes the GIL is released while the bytes move. */
#define RELEASE_GIL_BYTES (64 * 1024)

static PyObject *copy(PyObject *module, PyObject *args) {
    (void)module;
    Py_buffer destination, source;
    if (!PyArg_ParseTuple(args, "w*y*:copy", &destination, &source)) {
        return NULL;
    }
    if (source.len != destination.len) {
        PyErr_Format(PyExc_ValueError, "copy: %zd bytes into %zd", source.len, destination.len);
        PyBuffer_Release(&source);
        PyBuffer_Release(&destination);
        return NULL;
    }
    keep_in_front();
    int whole;
    if (source.len >= RELEASE_GIL_BYTES) {
        Py_BEGIN_ALLOW_THREADS
        whole = guarded_memcpy(destination.buf, source.buf, (size_t)source.len);
        Py_END_ALLOW_THREADS
    } else {
        whole = guarded_memcpy(destination.buf, source.buf, (size_t)source.len);
    }
    PyBuffer_Release(&source);
    PyBuffer_Release(&destination);
    return PyBool_FromLong(whole);
}

/* 1 when every page under [buf, buf + len) is in memory, 0 when one is not
   (or the range is not mapped: mincore fails). */
static int all_resident(const void *buf, size_t len) {
    static size_t page = 0;
    if (page == 0) {
        page = (size_t)sysconf(_SC_PAGESIZE);
    }
    uintptr_t at = (uintptr_t)buf & ~(uintptr_t)(page - 1);
    uintptr_t end = (uintptr_t)buf + len;
    unsigned char vector[1024];
    while (at < end) {
        size_t pages = (end - at + page - 1) / page;
        if (pages > sizeof(vector)) {
            pages = sizeof(vector);
        }
        if (mincore((void *)at, pages * page, vector) != 0) {
            return 0;
        }
        for (size_t i = 0; i < pages; i++) {
            if (!(vector[i] & 1)) {
                return 0;
            }
        }
        at += pages * page;
    }
    return 1;
}

static PyObject *resident(PyObject *module, PyObject *args) {
    (void)module;
    Py_buffer view;
    if (!PyArg_ParseTuple(args, "y*:resident", &view)) {
        return NULL;
    }
    int all;
    if (view.len >= RELEASE_GIL_BYTES) {
        Py_BEGIN_ALLOW_THREADS
        all = all_resident(view.buf, (size_t)view.len);
        Py_END_ALLOW_THREADS
    } else {
        all = all_resident(view.buf, (size_t)view.len);
    }
    PyBuffer_Release(&view);
    return PyBool_FromLong(all);
}

static PyMethodDef methods[] = {
    {"copy", copy, METH_VARARGS,
     "copy(destination, source) -> bool\n\n"
     "Copy source's bytes into destination (both contiguous, the same length).\n"
     "False: a bus fault (a mapped file that shrank) cut the copy short."},
    {"resident", resident, METH_VARARGS,
     "resident(view) -> bool\n\n"
     "Whether every page under the view (a mapping) is in memory (mincore)."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef definition = {
    PyModuleDef_HEAD_INIT, "_guarded", "memcpy that survives a mapped file shrinking.", -1,
    methods,
};

PyMODINIT_FUNC PyInit__guarded(void) {
    memset(&ours, 0, sizeof(ours));
    ours.sa_sigaction = on_bus;
    /* SA_NODEFER: see guarded_memcpy. */
    ours.sa_flags = SA_SIGINFO | SA_NODEFER;
    sigemptyset(&ours.sa_mask);
    keep_in_front();
    return PyModule_Create(&definition);
}
