/* A stand-in libnvidia-ml.so.1 for machines without a GPU.
 *
 * pynvml loads libnvidia-ml.so.1 with ctypes and looks each function up by name, so this
 * library drives the real pynvml code path (its structs, return codes and error classes)
 * and rankwatch's real NvmlBackend above it. Readings come from a text file named by
 * RANKWATCH_NVML_STANDIN ("key value" lines, re-read whenever the file changes), so a test
 * can change them while an agent runs:
 *
 *   count 2                         GPUs (default 1)
 *   init_ret 9                      nvmlInitWithFlags returns this NVML code
 *   vanish 9                        every call returns this code (driver unloaded mid-run)
 *   hang.nvmlDeviceGetPowerUsage 1  that call blocks until the line is removed
 *   ret.nvmlDeviceGetTemperature 3  that call returns this code (gpuN.ret.FN: one GPU only)
 *   gpu0.util 87                    per-GPU readings, see get() calls below for the keys
 *   gpu0.lost 1                     every call on GPU 0 returns GPU_IS_LOST
 *   xid.1 0:79                      Xid 79 on GPU 0, delivered once through nvmlEventSetWait_v2
 *   gpu0.no_link_sum 1              NVLink throughput with scopeId UINT_MAX is not summed (per link only)
 *
 * With RANKWATCH_NVML_STANDIN_CALLS naming a folder, each process counts the calls it makes
 * by function and writes "function count" lines to <folder>/calls-<pid>.txt at most once a
 * second (benchmarks compare how often two exporters call NVML).
 *
 * Built with -DSTANDIN_MINIMAL it leaves out the newer functions, so pynvml raises
 * NVMLError_FunctionNotFound for them as it does on an old driver.
 */
#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#define OK 0
#define E_UNINIT 1
#define E_INVALID 2
#define E_NOT_SUPPORTED 3
#define E_INSUFFICIENT 7
#define E_DRIVER 9
#define E_TIMEOUT 10
#define E_LOST 15
#define E_UNKNOWN 999
#define MAX_GPUS 16
#define MAX_KEYS 1024

typedef struct { int index; } device_t;
typedef device_t *nvmlDevice_t;
typedef struct { int id; } eventset_t;

static device_t devices[MAX_GPUS];
static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
static char keys[MAX_KEYS][96];
static char vals[MAX_KEYS][160];
static int nkeys;
static struct timespec seen_mtime;
static off_t seen_size = -1;
static int initialised;

static void reload_locked(void) {
    const char *path = getenv("RANKWATCH_NVML_STANDIN");
    struct stat st;
    if (!path || stat(path, &st) != 0) {
        nkeys = 0;
        seen_size = -1;
        return;
    }
    if (st.st_size == seen_size && st.st_mtim.tv_sec == seen_mtime.tv_sec &&
        st.st_mtim.tv_nsec == seen_mtime.tv_nsec)
        return;
    FILE *f = fopen(path, "r");
    if (!f) return;
    char line[300];
    int n = 0;
    while (n < MAX_KEYS && fgets(line, sizeof line, f)) {
        char *nl = strchr(line, '\n');
        if (nl) *nl = 0;
        if (line[0] == '#' || line[0] == 0) continue;
        char *sp = strchr(line, ' ');
        if (!sp) continue;
        *sp = 0;
        snprintf(keys[n], sizeof keys[n], "%.95s", line);
        snprintf(vals[n], sizeof vals[n], "%.159s", sp + 1);
        n++;
    }
    fclose(f);
    nkeys = n;
    seen_size = st.st_size;
    seen_mtime = st.st_mtim;
}

static const char *lookup_locked(const char *key) {
    for (int i = 0; i < nkeys; i++)
        if (strcmp(keys[i], key) == 0) return vals[i];
    return NULL;
}

/* The value of "gpuN.key", else "key", else NULL. */
static const char *get(int gpu, const char *key) {
    char full[128];
    const char *v = NULL;
    pthread_mutex_lock(&mu);
    reload_locked();
    if (gpu >= 0) {
        snprintf(full, sizeof full, "gpu%d.%s", gpu, key);
        v = lookup_locked(full);
    }
    if (!v) v = lookup_locked(key);
    pthread_mutex_unlock(&mu);
    return v; /* points into vals: stable until the next reload, fine for immediate use */
}

static double num(int gpu, const char *key, double dflt) {
    const char *v = get(gpu, key);
    return v ? strtod(v, NULL) : dflt;
}

static unsigned long long unum(int gpu, const char *key, unsigned long long dflt) {
    const char *v = get(gpu, key);
    return v ? strtoull(v, NULL, 0) : dflt;
}

#define MAX_FNS 128
static const char *fn_names[MAX_FNS]; /* the callers' string literals */
static unsigned long fn_calls[MAX_FNS];
static int nfns;
static time_t calls_written;

static void write_calls_locked(const char *dir) {
    char path[3000], tmp[3100];
    snprintf(path, sizeof path, "%.2900s/calls-%d.txt", dir, (int)getpid());
    snprintf(tmp, sizeof tmp, "%s.tmp", path);
    FILE *f = fopen(tmp, "w");
    if (!f) return;
    for (int j = 0; j < nfns; j++) fprintf(f, "%s %lu\n", fn_names[j], fn_calls[j]);
    fclose(f);
    rename(tmp, path);
}

/* One more call of fn; the counts written out when a new second has begun. */
static void count_call(const char *fn) {
    const char *dir = getenv("RANKWATCH_NVML_STANDIN_CALLS");
    if (!dir) return;
    pthread_mutex_lock(&mu);
    int i = 0;
    while (i < nfns && strcmp(fn_names[i], fn) != 0) i++;
    if (i == nfns && nfns < MAX_FNS) fn_names[nfns++] = fn;
    if (i < nfns) fn_calls[i]++;
    struct timespec now;
    clock_gettime(CLOCK_MONOTONIC, &now);
    if (now.tv_sec != calls_written) {
        calls_written = now.tv_sec;
        write_calls_locked(dir);
    }
    pthread_mutex_unlock(&mu);
}

/* The final counts of a process that exits normally (a killed one keeps the last second's). */
__attribute__((destructor)) static void write_calls_at_exit(void) {
    const char *dir = getenv("RANKWATCH_NVML_STANDIN_CALLS");
    if (!dir || !nfns) return;
    pthread_mutex_lock(&mu);
    write_calls_locked(dir);
    pthread_mutex_unlock(&mu);
}

static void nap_ms(int ms) {
    struct timespec ts = {ms / 1000, (ms % 1000) * 1000000L};
    nanosleep(&ts, NULL);
}

static int count(void) {
    int n = (int)num(-1, "count", 1);
    return n < 0 ? 0 : (n > MAX_GPUS ? MAX_GPUS : n);
}

/* Everything every call does first: scripted hangs, a vanished driver, forced codes, lost GPUs. */
static int enter(const char *fn, int gpu) {
    char key[128];
    count_call(fn);
    snprintf(key, sizeof key, "hang.%s", fn);
    for (int waited = 0; get(-1, key) && waited < 600000; waited += 20) nap_ms(20);
    const char *v = get(-1, "vanish");
    if (v && atoi(v)) return atoi(v) == 1 ? E_DRIVER : atoi(v);
    if (!initialised && strcmp(fn, "nvmlInitWithFlags") != 0 && strcmp(fn, "nvmlInit_v2") != 0 &&
        strcmp(fn, "nvmlErrorString") != 0)
        return E_UNINIT;
    snprintf(key, sizeof key, "ret.%s", fn);
    v = get(gpu, key);
    if (v && atoi(v)) return atoi(v);
    if (gpu >= 0 && num(gpu, "lost", 0)) return E_LOST;
    return OK;
}

static int gpu_of(nvmlDevice_t d) {
    if (!d) return -1;
    for (int i = 0; i < MAX_GPUS; i++)
        if (d == &devices[i]) return i < count() ? i : -1;
    return -1;
}

#define DEV_ENTER(fn)                          \
    int g = gpu_of(device);                    \
    if (g < 0) return E_INVALID;               \
    int rc_ = enter(fn, g);                    \
    if (rc_) return rc_;

/* ------------------------------------------------------------------ init and system */

int nvmlInitWithFlags(unsigned int flags) {
    (void)flags;
    int rc = enter("nvmlInitWithFlags", -1);
    if (rc) return rc;
    int r = (int)num(-1, "init_ret", 0);
    if (r) return r;
    for (int i = 0; i < MAX_GPUS; i++) devices[i].index = i;
    initialised = 1;
    return OK;
}

int nvmlInit_v2(void) { return nvmlInitWithFlags(0); }

int nvmlShutdown(void) {
    initialised = 0;
    return OK;
}

const char *nvmlErrorString(int result) {
    switch (result) {
    case OK: return "Success";
    case E_UNINIT: return "Uninitialized";
    case E_INVALID: return "Invalid Argument";
    case E_NOT_SUPPORTED: return "Not Supported";
    case 4: return "Insufficient Permissions";
    case E_INSUFFICIENT: return "Insufficient Size";
    case E_DRIVER: return "Driver Not Loaded";
    case E_TIMEOUT: return "Timeout";
    case E_LOST: return "GPU is lost";
    default: return "Unknown Error";
    }
}

static int copy_str(char *dst, unsigned int len, const char *src) {
    if (strlen(src) + 1 > len) return E_INSUFFICIENT;
    memcpy(dst, src, strlen(src) + 1);
    return OK;
}

int nvmlSystemGetDriverVersion(char *version, unsigned int length) {
    int rc = enter("nvmlSystemGetDriverVersion", -1);
    if (rc) return rc;
    const char *v = get(-1, "driver");
    return copy_str(version, length, v ? v : "550.54.15");
}

int nvmlDeviceGetCount_v2(unsigned int *n) {
    int rc = enter("nvmlDeviceGetCount_v2", -1);
    if (rc) return rc;
    *n = (unsigned int)count();
    return OK;
}

int nvmlDeviceGetHandleByIndex_v2(unsigned int index, nvmlDevice_t *device) {
    int rc = enter("nvmlDeviceGetHandleByIndex_v2", (int)index);
    if (rc) return rc;
    if ((int)index >= count()) return E_INVALID;
    *device = &devices[index];
    return OK;
}

int nvmlDeviceGetIndex(nvmlDevice_t device, unsigned int *index) {
    DEV_ENTER("nvmlDeviceGetIndex");
    *index = (unsigned int)g;
    return OK;
}

/* ------------------------------------------------------------------ identity */

int nvmlDeviceGetUUID(nvmlDevice_t device, char *uuid, unsigned int length) {
    DEV_ENTER("nvmlDeviceGetUUID");
    char buf[96];
    const char *v = get(g, "uuid");
    if (!v) {
        snprintf(buf, sizeof buf, "GPU-5ca1ab1e-0000-4000-8000-%012d", g);
        v = buf;
    }
    return copy_str(uuid, length, v);
}

int nvmlDeviceGetName(nvmlDevice_t device, char *name, unsigned int length) {
    DEV_ENTER("nvmlDeviceGetName");
    const char *v = get(g, "name");
    return copy_str(name, length, v ? v : "NVIDIA H100 80GB HBM3");
}

typedef struct {
    char busIdLegacy[16];
    unsigned int domain, bus, device, pciDeviceId, pciSubSystemId;
    char busId[32];
} nvmlPciInfo_t;

int nvmlDeviceGetPciInfo_v3(nvmlDevice_t device, nvmlPciInfo_t *pci) {
    DEV_ENTER("nvmlDeviceGetPciInfo_v3");
    memset(pci, 0, sizeof *pci);
    pci->bus = 0x18 + (unsigned int)g;
    snprintf(pci->busId, sizeof pci->busId, "00000000:%02X:00.0", pci->bus);
    snprintf(pci->busIdLegacy, sizeof pci->busIdLegacy, "0000:%02X:00.0", pci->bus);
    pci->pciDeviceId = 0x233010DE;
    return OK;
}

/* ------------------------------------------------------------------ readings */

typedef struct { unsigned long long total, free, used; } nvmlMemory_t;
typedef struct { unsigned int version; unsigned long long total, reserved, free, used; } nvmlMemory_v2_t;

int nvmlDeviceGetMemoryInfo(nvmlDevice_t device, nvmlMemory_t *m) {
    DEV_ENTER("nvmlDeviceGetMemoryInfo");
    m->total = unum(g, "mem_total", 85520809984ULL);
    /* nvml.h: v1 "used" is reserved plus allocated memory; mem_used is the allocated part (v2's
     * "used"). A driver without the v2 record (STANDIN_MINIMAL) reports no reserved part. */
#ifdef STANDIN_MINIMAL
    m->used = unum(g, "mem_used", 1073741824ULL);
#else
    m->used = unum(g, "mem_used", 1073741824ULL) + unum(g, "mem_reserved", 553648128ULL);
#endif
    m->free = m->total - m->used;
    return OK;
}

#ifndef STANDIN_MINIMAL
int nvmlDeviceGetMemoryInfo_v2(nvmlDevice_t device, nvmlMemory_v2_t *m) {
    DEV_ENTER("nvmlDeviceGetMemoryInfo_v2");
    m->total = unum(g, "mem_total", 85520809984ULL);
    m->reserved = unum(g, "mem_reserved", 553648128ULL);
    m->used = unum(g, "mem_used", 1073741824ULL);
    m->free = m->total - m->reserved - m->used;
    return OK;
}
#endif

typedef struct { unsigned int gpu, memory; } nvmlUtilization_t;

int nvmlDeviceGetUtilizationRates(nvmlDevice_t device, nvmlUtilization_t *u) {
    DEV_ENTER("nvmlDeviceGetUtilizationRates");
    u->gpu = (unsigned int)num(g, "util", 0);
    u->memory = (unsigned int)num(g, "mem_util", 0);
    return OK;
}

int nvmlDeviceGetTemperature(nvmlDevice_t device, int sensor, unsigned int *t) {
    DEV_ENTER("nvmlDeviceGetTemperature");
    (void)sensor;
    *t = (unsigned int)num(g, "temp", 34);
    return OK;
}

int nvmlDeviceGetPowerUsage(nvmlDevice_t device, unsigned int *mw) {
    DEV_ENTER("nvmlDeviceGetPowerUsage");
    *mw = (unsigned int)num(g, "power_mw", 70000);
    return OK;
}

int nvmlDeviceGetEnforcedPowerLimit(nvmlDevice_t device, unsigned int *mw) {
    DEV_ENTER("nvmlDeviceGetEnforcedPowerLimit");
    *mw = (unsigned int)num(g, "power_limit_mw", 700000);
    return OK;
}

int nvmlDeviceGetClockInfo(nvmlDevice_t device, int type, unsigned int *mhz) {
    DEV_ENTER("nvmlDeviceGetClockInfo");
    *mhz = (unsigned int)(type == 2 ? num(g, "mem_clock", 2619) : num(g, "sm_clock", 1980));
    return OK;
}

int nvmlDeviceGetCurrentClocksThrottleReasons(nvmlDevice_t device, unsigned long long *r) {
    DEV_ENTER("nvmlDeviceGetCurrentClocksThrottleReasons");
    *r = unum(g, "throttle", 0);
    return OK;
}

int nvmlDeviceGetSupportedClocksThrottleReasons(nvmlDevice_t device, unsigned long long *r) {
    DEV_ENTER("nvmlDeviceGetSupportedClocksThrottleReasons");
    *r = unum(g, "throttle_supported", 0x1ff);
    return OK;
}

#ifndef STANDIN_MINIMAL
int nvmlDeviceGetCurrentClocksEventReasons(nvmlDevice_t device, unsigned long long *r) {
    DEV_ENTER("nvmlDeviceGetCurrentClocksEventReasons");
    *r = unum(g, "throttle", 0);
    return OK;
}

int nvmlDeviceGetSupportedClocksEventReasons(nvmlDevice_t device, unsigned long long *r) {
    DEV_ENTER("nvmlDeviceGetSupportedClocksEventReasons");
    *r = unum(g, "throttle_supported", 0x1ff);
    return OK;
}
#endif

int nvmlDeviceGetTotalEccErrors(nvmlDevice_t device, int type, int counter, unsigned long long *n) {
    DEV_ENTER("nvmlDeviceGetTotalEccErrors");
    char key[64];
    snprintf(key, sizeof key, "ecc_%s_%s", type ? "uncorrected" : "corrected", counter ? "aggregate" : "volatile");
    *n = unum(g, key, 0);
    return OK;
}

int nvmlDeviceGetRetiredPages(nvmlDevice_t device, int cause, unsigned int *n, unsigned long long *addrs) {
    DEV_ENTER("nvmlDeviceGetRetiredPages");
    unsigned int have = (unsigned int)num(g, cause ? "retired_dbe" : "retired_sbe", 0);
    if (!addrs || *n < have) {
        *n = have;
        return have ? E_INSUFFICIENT : OK;
    }
    for (unsigned int i = 0; i < have; i++) addrs[i] = 0x1000ULL * (i + 1);
    *n = have;
    return OK;
}

int nvmlDeviceGetRetiredPagesPendingStatus(nvmlDevice_t device, int *pending) {
    DEV_ENTER("nvmlDeviceGetRetiredPagesPendingStatus");
    *pending = (int)num(g, "retired_pending", 0);
    return OK;
}

int nvmlDeviceGetRemappedRows(nvmlDevice_t device, unsigned int *corr, unsigned int *unc, unsigned int *pending,
                              unsigned int *failure) {
    DEV_ENTER("nvmlDeviceGetRemappedRows");
    *corr = (unsigned int)num(g, "remapped_corr", 0);
    *unc = (unsigned int)num(g, "remapped_unc", 0);
    *pending = (unsigned int)num(g, "remap_pending", 0);
    *failure = (unsigned int)num(g, "remap_failure", 0);
    return OK;
}

int nvmlDeviceGetPcieReplayCounter(nvmlDevice_t device, unsigned int *n) {
    DEV_ENTER("nvmlDeviceGetPcieReplayCounter");
    *n = (unsigned int)num(g, "pcie_replays", 0);
    return OK;
}

typedef struct {
    unsigned int pid;
    unsigned long long usedGpuMemory;
    unsigned int gpuInstanceId, computeInstanceId;
} nvmlProcessInfo_t;

int nvmlDeviceGetComputeRunningProcesses_v3(nvmlDevice_t device, unsigned int *n, nvmlProcessInfo_t *infos) {
    DEV_ENTER("nvmlDeviceGetComputeRunningProcesses_v3");
    unsigned int pids[64];
    unsigned int have = 0;
    const char *v = get(g, "pids");
    char buf[160];
    snprintf(buf, sizeof buf, "%s", v ? v : "");
    for (char *tok = strtok(buf, ","); tok && have < 64; tok = strtok(NULL, ",")) pids[have++] = (unsigned int)atoi(tok);
    if (!infos || *n < have) {
        *n = have;
        return have ? E_INSUFFICIENT : OK;
    }
    for (unsigned int i = 0; i < have; i++) {
        infos[i].pid = pids[i];
        infos[i].usedGpuMemory = 512ULL << 20;
        infos[i].gpuInstanceId = 0xFFFFFFFF;
        infos[i].computeInstanceId = 0xFFFFFFFF;
    }
    *n = have;
    return OK;
}

/* ------------------------------------------------------------------ newer counters */

#ifndef STANDIN_MINIMAL
int nvmlDeviceGetTotalEnergyConsumption(nvmlDevice_t device, unsigned long long *mj) {
    DEV_ENTER("nvmlDeviceGetTotalEnergyConsumption");
    *mj = unum(g, "energy_mj", 123456789ULL);
    return OK;
}

int nvmlDeviceGetPcieThroughput(nvmlDevice_t device, int counter, unsigned int *kbs) {
    DEV_ENTER("nvmlDeviceGetPcieThroughput");
    *kbs = (unsigned int)num(g, counter ? "pcie_rx_kbs" : "pcie_tx_kbs", 0);
    return OK;
}

typedef struct { unsigned long long referenceTime, violationTime; } nvmlViolationTime_t;

int nvmlDeviceGetViolationStatus(nvmlDevice_t device, int policy, nvmlViolationTime_t *t) {
    DEV_ENTER("nvmlDeviceGetViolationStatus");
    char key[64];
    snprintf(key, sizeof key, "violation%d_ns", policy);
    const char *v = get(g, key);
    if (!v) return E_NOT_SUPPORTED;
    t->referenceTime = 1700000000000000000ULL;
    t->violationTime = strtoull(v, NULL, 0);
    return OK;
}

int nvmlDeviceGetCudaComputeCapability(nvmlDevice_t device, int *major, int *minor) {
    DEV_ENTER("nvmlDeviceGetCudaComputeCapability");
    double cc = num(g, "cc", 9.0);
    *major = (int)cc;
    *minor = (int)((cc - (int)cc) * 10 + 0.5);
    return OK;
}

typedef struct {
    unsigned int fieldId, scopeId;
    long long timestamp, latencyUsec;
    int valueType, nvmlReturn;
    union { double d; unsigned int ui; unsigned long ul; unsigned long long ull; long long sll; int si; } value;
} nvmlFieldValue_t;

/* "gpuN.fieldF.<link>" summed over the links listed, in one pass (one reload check). */
static int sum_links(int gpu, unsigned int field, char *out, size_t size) {
    char prefix[48];
    int plen = snprintf(prefix, sizeof prefix, "gpu%d.field%u.", gpu, field);
    unsigned long long total = 0;
    int found = 0;
    pthread_mutex_lock(&mu);
    reload_locked();
    for (int i = 0; i < nkeys; i++)
        if (strncmp(keys[i], prefix, (size_t)plen) == 0) {
            total += strtoull(vals[i], NULL, 0);
            found = 1;
        }
    pthread_mutex_unlock(&mu);
    if (found) snprintf(out, size, "%llu", total);
    return found;
}

int nvmlDeviceGetFieldValues(nvmlDevice_t device, int n, nvmlFieldValue_t *values) {
    DEV_ENTER("nvmlDeviceGetFieldValues");
    for (int i = 0; i < n; i++) {
        nvmlFieldValue_t *f = &values[i];
        char key[64];
        if (f->scopeId != 0xFFFFFFFFu && f->fieldId >= 138 && f->fieldId <= 141)
            snprintf(key, sizeof key, "field%u.%u", f->fieldId, f->scopeId);
        else
            snprintf(key, sizeof key, "field%u", f->fieldId);
        const char *v = get(g, key);
        char sum[32];
        if (!v && f->scopeId == 0xFFFFFFFFu && f->fieldId >= 138 && f->fieldId <= 141 &&
            !num(g, "no_link_sum", 0) && sum_links(g, f->fieldId, sum, sizeof sum))
            v = sum; /* nvml.h: a scopeId of UINT_MAX sums the counter over all links */
        f->timestamp = (long long)time(NULL) * 1000000LL;
        f->latencyUsec = 0;
        if (!v) {
            f->nvmlReturn = E_NOT_SUPPORTED;
            continue;
        }
        f->nvmlReturn = OK;
        f->valueType = 3; /* unsigned long long */
        f->value.ull = strtoull(v, NULL, 0);
    }
    return OK;
}

/* GPM (Hopper and later): an opaque sample and derived metrics. */
typedef struct { unsigned int version, isSupportedDevice; } nvmlGpmSupport_t;
typedef struct { int gpu; } gpm_sample_t;
typedef struct { const char *shortName, *longName, *unit; } metric_info_t;
typedef struct { unsigned int metricId; int nvmlReturn; double value; metric_info_t info; } nvmlGpmMetric_t;
typedef struct {
    unsigned int version, numMetrics;
    gpm_sample_t *sample1, *sample2;
    nvmlGpmMetric_t metrics[477];
} nvmlGpmMetricsGet_t;

int nvmlGpmQueryDeviceSupport(nvmlDevice_t device, nvmlGpmSupport_t *s) {
    DEV_ENTER("nvmlGpmQueryDeviceSupport");
    s->isSupportedDevice = (unsigned int)num(g, "gpm", 0);
    return OK;
}

int nvmlGpmSampleAlloc(gpm_sample_t **s) {
    *s = calloc(1, sizeof **s);
    return *s ? OK : E_UNKNOWN;
}

int nvmlGpmSampleFree(gpm_sample_t *s) {
    free(s);
    return OK;
}

int nvmlGpmSampleGet(nvmlDevice_t device, gpm_sample_t *s) {
    DEV_ENTER("nvmlGpmSampleGet");
    if (!num(g, "gpm", 0)) return E_NOT_SUPPORTED;
    s->gpu = g;
    return OK;
}

int nvmlGpmMetricsGet(nvmlGpmMetricsGet_t *m) {
    int rc = enter("nvmlGpmMetricsGet", m && m->sample2 ? m->sample2->gpu : -1);
    if (rc) return rc;
    if (!m || !m->sample1 || !m->sample2 || m->numMetrics > 477) return E_INVALID;
    for (unsigned int i = 0; i < m->numMetrics; i++) {
        char key[64];
        snprintf(key, sizeof key, "gpm%u", m->metrics[i].metricId);
        const char *v = get(m->sample2->gpu, key);
        m->metrics[i].nvmlReturn = v ? OK : E_NOT_SUPPORTED;
        m->metrics[i].value = v ? strtod(v, NULL) : 0.0;
    }
    return OK;
}

/* ------------------------------------------------------------------ Xid events */

static eventset_t the_set;
static long delivered_xid; /* highest xid.<seq> handed out */

typedef struct {
    nvmlDevice_t device;
    unsigned long long eventType, eventData;
    unsigned int gpuInstanceId, computeInstanceId;
} nvmlEventData_t;

int nvmlEventSetCreate(eventset_t **set) {
    int rc = enter("nvmlEventSetCreate", -1);
    if (rc) return rc;
    *set = &the_set;
    return OK;
}

int nvmlDeviceGetSupportedEventTypes(nvmlDevice_t device, unsigned long long *types) {
    DEV_ENTER("nvmlDeviceGetSupportedEventTypes");
    *types = 0x8 | 0x10; /* Xid critical error, double-bit ECC */
    return OK;
}

int nvmlDeviceRegisterEvents(nvmlDevice_t device, unsigned long long types, eventset_t *set) {
    DEV_ENTER("nvmlDeviceRegisterEvents");
    (void)types;
    (void)set;
    return OK;
}

/* The next undelivered "xid.<seq> <gpu>:<xid>" line, or 0. */
static int next_xid(int *gpu, unsigned long long *xid) {
    char key[32];
    snprintf(key, sizeof key, "xid.%ld", delivered_xid + 1);
    const char *v = get(-1, key);
    if (!v) return 0;
    *gpu = atoi(v);
    const char *colon = strchr(v, ':');
    *xid = colon ? strtoull(colon + 1, NULL, 10) : 0;
    delivered_xid++;
    return 1;
}

int nvmlEventSetWait_v2(eventset_t *set, nvmlEventData_t *data, unsigned int timeoutms) {
    int rc = enter("nvmlEventSetWait_v2", -1);
    if (rc) return rc;
    (void)set;
    int gpu;
    unsigned long long xid;
    /* Looked for before and after the wait, not polled through it: the driver sleeps in the
     * kernel until an event comes, and a poll here would bill the agent CPU a real NVML does
     * not (benchmarks compare it with exporters that never wait on events). An Xid scripted
     * during the wait is delivered at its end. */
    for (int pass = 0; pass < 2; pass++) {
        if (next_xid(&gpu, &xid)) {
            memset(data, 0, sizeof *data);
            data->device = (gpu >= 0 && gpu < MAX_GPUS) ? &devices[gpu] : NULL;
            data->eventType = 0x8;
            data->eventData = xid;
            return OK;
        }
        if (pass == 0 && timeoutms > 0) nap_ms((int)timeoutms);
    }
    return E_TIMEOUT;
}

int nvmlEventSetFree(eventset_t *set) {
    (void)set;
    return OK;
}
#endif
