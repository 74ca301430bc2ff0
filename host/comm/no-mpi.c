/*
 * comm/no-mpi.c: compiled in the place of comm/mpi.c in a build without MPI
 * (MPI=0, or no Open MPI found): there is no MPI implementation, so
 * lt_dist_init refuses a launch by mpirun with several ranks, and
 * lt_has_mpi and `lutra --version` say MPI is not compiled in.
 */
#include "comm/comm-impl.h"

const lt_comm_impl *lt_comm_mpi(void) { return NULL; }
