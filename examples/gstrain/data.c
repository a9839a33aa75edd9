/* Fashion-MNIST loading: IDX files (big-endian header: magic, dimensions;
 * then unsigned bytes) inside gzip, read through zlib. */
#include "data.h"
#include "util.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <zlib.h>

#define IDX_MAGIC_LABELS 0x00000801u /* unsigned byte, 1 dimension */
#define IDX_MAGIC_IMAGES 0x00000803u /* unsigned byte, 3 dimensions */
#define INSTALL_HINT     "install it with `apt-get install dataset-fashion-mnist` or pass --data DIR"
#define CORRUPT_HINT                                                                                         \
    "the file is corrupt; reinstall it with `apt-get install --reinstall dataset-fashion-mnist`"

/* Fashion-MNIST training-set pixel mean and standard deviation (of x/255). */
#define PIXEL_MEAN 0.2860f
#define PIXEL_STD  0.3530f

typedef struct idx_file {
    gzFile gz;
    char path[4096];
} idx_file;

static gs_status idx_open(const char *dir, const char *split, const char *kind, idx_file *f)
{
    snprintf(f->path, sizeof(f->path), "%s/%s-%s.gz", dir, split, kind);
    f->gz = gzopen(f->path, "rb");
    if (!f->gz)
        return gt_fail(GS_ERR_IO, "cannot open the Fashion-MNIST file %s: %s; %s", f->path,
                       errno ? strerror(errno) : "out of memory", INSTALL_HINT);
    return GS_OK;
}

/* Reads exactly len bytes; a short read or a gzip error is corruption. */
static gs_status idx_read(idx_file *f, void *buf, size_t len, const char *what)
{
    unsigned char *p = buf;
    while (len > 0) {
        unsigned chunk = len > (1u << 30) ? (1u << 30) : (unsigned)len;
        int n = gzread(f->gz, p, chunk);
        if (n <= 0) {
            int zerr = 0;
            const char *msg = gzerror(f->gz, &zerr);
            return gt_fail(GS_ERR_IO, "%s: cannot read the %s (%s); %s", f->path, what,
                           n == 0 || zerr == Z_OK ? "file too short" : msg, CORRUPT_HINT);
        }
        p += n;
        len -= (size_t)n;
    }
    return GS_OK;
}

static uint32_t be32(const unsigned char *b)
{
    return (uint32_t)b[0] << 24 | (uint32_t)b[1] << 16 | (uint32_t)b[2] << 8 | b[3];
}

/* Reads the header: magic, then `dims` big-endian sizes into dim[]. */
static gs_status idx_header(idx_file *f, uint32_t magic, int dims, uint32_t *dim)
{
    unsigned char head[16];
    gs_status st = idx_read(f, head, (size_t)(1 + dims) * 4, "header");
    if (st != GS_OK)
        return st;
    if (be32(head) != magic)
        return gt_fail(GS_ERR_IO, "%s: bad IDX magic 0x%08x (expected 0x%08x); %s", f->path, be32(head),
                       magic, CORRUPT_HINT);
    for (int i = 0; i < dims; i++)
        dim[i] = be32(head + 4 * (i + 1));
    return GS_OK;
}

static gs_status load_labels(const char *dir, const char *split, size_t *count_p, uint8_t **labels_p)
{
    idx_file f = {0};
    uint32_t count = 0;
    uint8_t *labels = NULL;
    gs_status st = idx_open(dir, split, "labels-idx1-ubyte", &f);
    if (st != GS_OK)
        return st;
    st = idx_header(&f, IDX_MAGIC_LABELS, 1, &count);
    if (st != GS_OK)
        goto out_close;
    labels = malloc(count ? count : 1);
    if (!labels) {
        st = gt_fail(GS_ERR_NOMEM, "%s: no memory for %u labels", f.path, count);
        goto out_close;
    }
    st = idx_read(&f, labels, count, "labels");
    for (uint32_t i = 0; st == GS_OK && i < count; i++)
        if (labels[i] >= GT_CLASSES)
            st = gt_fail(GS_ERR_IO, "%s: label %u of image %u is out of range; %s", f.path, labels[i], i,
                         CORRUPT_HINT);
    if (st != GS_OK) {
        free(labels);
        goto out_close;
    }
    *count_p = count;
    *labels_p = labels;
out_close:
    gzclose(f.gz);
    return st;
}

/* Loads the first `count` images (the labels file said how many there are). */
static gs_status load_pixels(const char *dir, const char *split, size_t count, uint8_t **pixels_p)
{
    idx_file f = {0};
    uint32_t dim[3] = {0};
    uint8_t *pixels = NULL;
    gs_status st = idx_open(dir, split, "images-idx3-ubyte", &f);
    if (st != GS_OK)
        return st;
    st = idx_header(&f, IDX_MAGIC_IMAGES, 3, dim);
    if (st != GS_OK)
        goto out_close;
    if (dim[1] != GT_IMAGE_SIDE || dim[2] != GT_IMAGE_SIDE || dim[0] < count) {
        st = gt_fail(GS_ERR_IO, "%s: holds %u images of %ux%u, expected at least %zu of %dx%d; %s", f.path,
                     dim[0], dim[1], dim[2], count, GT_IMAGE_SIDE, GT_IMAGE_SIDE, CORRUPT_HINT);
        goto out_close;
    }
    pixels = malloc(count * GT_IMAGE_PIXELS + 1);
    if (!pixels) {
        st = gt_fail(GS_ERR_NOMEM, "%s: no memory for %zu images", f.path, count);
        goto out_close;
    }
    st = idx_read(&f, pixels, count * GT_IMAGE_PIXELS, "images");
    if (st != GS_OK) {
        free(pixels);
        goto out_close;
    }
    *pixels_p = pixels;
out_close:
    gzclose(f.gz);
    return st;
}

gs_status gt_data_load(const char *dir, const char *split, size_t limit, gt_dataset *set_p)
{
    gt_dataset set = {0};
    gs_status st = load_labels(dir, split, &set.count, &set.labels);
    if (st != GS_OK)
        return st;
    if (limit > 0 && limit < set.count)
        set.count = limit;
    st = load_pixels(dir, split, set.count, &set.pixels);
    if (st != GS_OK) {
        free(set.labels);
        return st;
    }
    *set_p = set;
    return GS_OK;
}

void gt_data_free(gt_dataset *set)
{
    free(set->pixels);
    free(set->labels);
    *set = (gt_dataset){0};
}

void gt_data_image(const gt_dataset *set, size_t index, float *out)
{
    const uint8_t *px = set->pixels + index * GT_IMAGE_PIXELS;
    const float scale = 1.0f / (255.0f * PIXEL_STD), shift = PIXEL_MEAN / PIXEL_STD;
    for (size_t i = 0; i < GT_IMAGE_PIXELS; i++)
        out[i] = (float)px[i] * scale - shift;
}
