build-fuzz/host/dtype.o: host/dtype.c host/status.h host/lutra.h

host/status.h:

host/lutra.h:
