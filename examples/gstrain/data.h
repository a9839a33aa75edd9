/* Fashion-MNIST from its IDX .gz files (Debian: dataset-fashion-mnist). */
#ifndef GT_DATA_H
#define GT_DATA_H

#include "gradsync.h"

#include <stddef.h>
#include <stdint.h>

#define GT_DATA_DIR_DEFAULT "/usr/share/datasets/fashion-mnist"
#define GT_IMAGE_SIDE       28
#define GT_IMAGE_PIXELS     (GT_IMAGE_SIDE * GT_IMAGE_SIDE)
#define GT_CLASSES          10

typedef struct gt_dataset {
    size_t count;
    uint8_t *pixels; /* count x GT_IMAGE_PIXELS, as stored (0..255) */
    uint8_t *labels; /* count, 0..GT_CLASSES-1 */
} gt_dataset;

/* Loads split "train" or "t10k" from dir: <split>-images-idx3-ubyte.gz and
 * <split>-labels-idx1-ubyte.gz. limit > 0 keeps only the first limit images.
 * A missing, truncated or malformed file is an error that names the file and
 * says how to install the dataset. */
gs_status gt_data_load(const char *dir, const char *split, size_t limit, gt_dataset *set_p);
void gt_data_free(gt_dataset *set);

/* Writes image `index` into out as normalized floats ((x/255 - mean) / std). */
void gt_data_image(const gt_dataset *set, size_t index, float *out);

#endif
