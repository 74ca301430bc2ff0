/*
 * core/build-info.h: core's part of the build's description (core/backend.c);
 * host/app/build-info.c adds the collectives' MPI line (comm/comm.h) to make
 * lutra.h's lt_build_info, as core may not call comm.
 */
#ifndef LUTRA_CORE_BUILD_INFO_H
#define LUTRA_CORE_BUILD_INFO_H

/* The lines of lt_build_info up to MPI's: lutra's version, the CPU (BLAS
   configuration, threads), CUDA (compiled in, runtime and driver, the
   devices found); a static buffer, without a final newline. */
const char *lt_core_build_info(void);

#endif
