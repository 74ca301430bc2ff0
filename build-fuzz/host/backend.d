build-fuzz/host/backend.o: host/backend.c host/status.h host/lutra.h \
  host/tensor-impl.h /usr/local/cuda/include/cuda_runtime_api.h \
  /usr/local/cuda/include/crt/host_defines.h \
  /usr/local/cuda/include/builtin_types.h \
  /usr/local/cuda/include/device_types.h \
  /usr/local/cuda/include/driver_types.h \
  /usr/local/cuda/include/vector_types.h \
  /usr/local/cuda/include/surface_types.h \
  /usr/local/cuda/include/texture_types.h \
  /usr/local/cuda/include/cuda_device_runtime_api.h \
  /usr/lib/x86_64-linux-gnu/openmpi/include/mpi.h \
  /usr/lib/x86_64-linux-gnu/openmpi/include/mpi_portable_platform.h

host/status.h:

host/lutra.h:

host/tensor-impl.h:

/usr/local/cuda/include/cuda_runtime_api.h:

/usr/local/cuda/include/crt/host_defines.h:

/usr/local/cuda/include/builtin_types.h:

/usr/local/cuda/include/device_types.h:

/usr/local/cuda/include/driver_types.h:

/usr/local/cuda/include/vector_types.h:

/usr/local/cuda/include/surface_types.h:

/usr/local/cuda/include/texture_types.h:

/usr/local/cuda/include/cuda_device_runtime_api.h:

/usr/lib/x86_64-linux-gnu/openmpi/include/mpi.h:

/usr/lib/x86_64-linux-gnu/openmpi/include/mpi_portable_platform.h:
