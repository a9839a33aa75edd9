/*
 * The host id: equal for two ranks exactly when they can share memory and
 * see each other's processes. The host name alone is not enough (containers
 * and network namespaces on one machine share or fake it), so the id also
 * hashes the kernel's boot id and the inodes of this process's network, IPC
 * and PID namespaces.
 */
#include "bootstrap/boot.h"

#include "util/log.h"

#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

static uint64_t mix(uint64_t hash, const void *data, size_t len)
{
    const unsigned char *p = data;
    for (size_t i = 0; i < len; i++)
        hash = (hash ^ p[i]) * 0x100000001b3ull;
    return hash;
}

static uint64_t mix_file(uint64_t hash, const char *path)
{
    char text[128] = {0};
    FILE *f = fopen(path, "r");
    if (!f) {
        gs_log_debug(BOOT, "host id: cannot read %s; leaving it out", path);
        return hash;
    }
    if (!fgets(text, sizeof(text), f))
        text[0] = '\0';
    fclose(f);
    return mix(hash, text, strlen(text));
}

static uint64_t mix_ns(uint64_t hash, const char *path)
{
    struct stat st;
    if (stat(path, &st) != 0) {
        gs_log_debug(BOOT, "host id: cannot stat %s; leaving it out", path);
        return hash;
    }
    hash = mix(hash, &st.st_dev, sizeof(st.st_dev));
    return mix(hash, &st.st_ino, sizeof(st.st_ino));
}

void gs_boot_host_id(char *buf, size_t cap)
{
    char host[65] = "?";
    uint64_t hash = 0xcbf29ce484222325ull;

    if (gethostname(host, sizeof(host) - 1) != 0)
        snprintf(host, sizeof(host), "?");
    hash = mix(hash, host, strlen(host));
    hash = mix_file(hash, "/proc/sys/kernel/random/boot_id");
    hash = mix_ns(hash, "/proc/self/ns/net");
    hash = mix_ns(hash, "/proc/self/ns/ipc");
    hash = mix_ns(hash, "/proc/self/ns/pid");
    snprintf(buf, cap, "%s:%016llx", host, (unsigned long long)hash);
}

void gs_host_id(char *buf, size_t cap)
{
    if (buf && cap > 0)
        gs_boot_host_id(buf, cap);
}

uint64_t gs_boot_machine_id(void)
{
    char text[128] = {0};
    FILE *f = fopen("/proc/sys/kernel/random/boot_id", "r");
    if (!f)
        return 0;
    if (!fgets(text, sizeof(text), f))
        text[0] = '\0';
    fclose(f);
    return text[0] ? mix(0xcbf29ce484222325ull, text, strlen(text)) : 0;
}
