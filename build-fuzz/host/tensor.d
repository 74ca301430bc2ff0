build-fuzz/host/tensor.o: host/tensor.c host/autograd.h host/status.h \
  host/lutra.h host/tensor-impl.h host/grad-ops.h

host/autograd.h:

host/status.h:

host/lutra.h:

host/tensor-impl.h:

host/grad-ops.h:
