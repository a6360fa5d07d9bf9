"""Main's int8 flat kernel under Nsight Compute (run 118's sass-main/sass.csv.gz, the second kernel of the
report): its chunk loop's warp-state samples and executed instructions by region, the regions found by their
first instructions (the refill after the barrier, the K loads, the first max, the V loads).

    python regions.py sass.csv.gz
"""
import csv, gzip, sys
rows = list(csv.reader(gzip.open(sys.argv[1], 'rt')))
k = -1; kernels = []; hdr = None
for r in rows:
    if len(r) == 1 or (r and r[0] == 'Kernel Name'): k += 1; kernels.append([]); continue
    if r[0] == 'Address': hdr = r; continue
    kernels[k].append(r)
ins = kernels[1]
start = next(i for i, r in enumerate(ins) if 'DEPBAR.LE' in r[1] and int(r[5]) > 100000)
end = next(i for i in range(len(ins) - 1, start, -1)   # the loop's back branch
           if 'BRA' in ins[i][1] and int(ins[i][5]) > 100000 and i > start + 300)
def first(pat, after):
    return next(i for i in range(after, end) if pat in ins[i][1] and int(ins[i][5] or 0) > 0)
k_start = first('LDSM.16.M88', start)
soft = first('FMNMX', k_start)
pv = first('LDSM.16.MT88', soft)
marks = [('barrier+wait', start, start + 4), ('refill (copies, lookups)', start + 4, k_start),
         ('K: load, convert, QK mma, key scale, mask', k_start, soft), ('softmax (max, rescale, exp, pack)', soft, pv),
         ('V: load, convert, PV mma', pv, end + 1)]
tot_s = sum(int(r[2] or 0) for r in ins); tot_e = sum(int(r[5] or 0) for r in ins)
loop_s = sum(int(ins[i][2] or 0) for i in range(start, end + 1))
print(f'kernel samples {tot_s}, loop {loop_s} ({100*loop_s/tot_s:.0f}%); executed {tot_e}')
for name, a, b in marks:
    s = sum(int(ins[i][2] or 0) for i in range(a, b)); e = sum(int(ins[i][5] or 0) for i in range(a, b))
    print(f'{name:45s} samples {s:6d} ({100*s/tot_s:4.1f}%)  instructions {e:9d} ({100*e/tot_e:4.1f}%)')
