/* What the files of gsbench share: gsbench.c (collectives, --kernels, the
 * options) hands --ps over to gsbench_ps.c. */
#ifndef GSBENCH_GSBENCH_H
#define GSBENCH_GSBENCH_H

/* gsbench --ps: the parameter-server benchmark; argv is gsbench's own. */
int gs_bench_ps_main(int argc, char **argv);

#endif
