#!/bin/sh
# usage: build.sh A.c B.c
set -e
W=/work/wt/perf2
F="-std=c11 -O2 -g -D_DEFAULT_SOURCE -I$W/src -mavx2 -mfma -mf16c"
cc $F -Dkern_avx2_fill=kern_avx2_fill_a -c -o /tmp/ab/a.o $1
cc $F -Dkern_avx2_fill=kern_avx2_fill_b -c -o /tmp/ab/b.o $2
cc -std=c11 -O2 -D_DEFAULT_SOURCE -I$W/src -o /tmp/ab/drv /tmp/ab/drv.c /tmp/ab/a.o /tmp/ab/b.o $W/build/libhearth.a -lm -lpthread
