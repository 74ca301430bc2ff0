build-fuzz/host/alloc-cpu.o: host/alloc-cpu.c host/status.h host/lutra.h \
  host/tensor-impl.h

host/status.h:

host/lutra.h:

host/tensor-impl.h:
