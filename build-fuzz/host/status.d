build-fuzz/host/status.o: host/status.c host/status.h host/lutra.h

host/status.h:

host/lutra.h:
