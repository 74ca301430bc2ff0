build-fuzz/host/backend-cpu.o: host/backend-cpu.c \
  host/../kernels/cpu/cpu.h host/../kernels/cpu/../../host/tensor-impl.h \
  host/lutra.h host/status.h

host/../kernels/cpu/cpu.h:

host/../kernels/cpu/../../host/tensor-impl.h:

host/lutra.h:

host/status.h:
