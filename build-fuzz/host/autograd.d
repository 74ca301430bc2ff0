build-fuzz/host/autograd.o: host/autograd.c host/autograd.h host/status.h \
  host/lutra.h host/tensor-impl.h

host/autograd.h:

host/status.h:

host/lutra.h:

host/tensor-impl.h:
