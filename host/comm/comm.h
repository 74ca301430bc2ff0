/*
 * comm/comm.h: what the layers above comm (host/app) use of it beyond the
 * collectives of lutra.h.
 */
#ifndef LUTRA_COMM_H
#define LUTRA_COMM_H

/* The MPI line of `lutra --version`: "mpi: compiled in (Open MPI v4.1.6)"
   (the library's own version, up to its first comma) or "mpi: not compiled
   in (MPI=0)"; a static buffer, no newline. */
const char *lt_comm_build_info(void);

#endif
