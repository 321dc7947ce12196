#!/bin/bash
# g12 again; keeps the first run's folder as g12-first
[ -d /work/bb5/g12-first ] || cp -r /work/bb5/g12 /work/bb5/g12-first
/work/bb5/g12.sh; rm -rf /work/bb5/g12x; cp -r /work/bb5/g12 /work/bb5/g12x; rm -rf /work/bb5/g12; mv /work/bb5/g12-first /work/bb5/g12
