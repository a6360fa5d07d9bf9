"""Partial-kernel source variants for run 31: the score chains split in two (even and odd k-steps)."""
OLD = '''            s[nt][0] = s[nt][1] = s[nt][2] = s[nt][3] = 0.f;
            #pragma unroll
            for (int kk = 0; kk < DK; kk += 2) {
              uint32_t b[4];
              mlxcel::load_matrices(b, keys + (token0 + nt * 8 + (lane & 7)) * STRIDE + kk * 16 + (lane >> 3) * 8);
              mlxcel::Mma<T>::run(s[nt], qf[kk], b[0], b[1]);
              mlxcel::Mma<T>::run(s[nt], qf[kk + 1], b[2], b[3]);
            }'''
NEW = '''            s[nt][0] = s[nt][1] = s[nt][2] = s[nt][3] = 0.f;
            float odd[4] = {0.f, 0.f, 0.f, 0.f};
            #pragma unroll
            for (int kk = 0; kk < DK; kk += 2) {
              uint32_t b[4];
              mlxcel::load_matrices(b, keys + (token0 + nt * 8 + (lane & 7)) * STRIDE + kk * 16 + (lane >> 3) * 8);
              mlxcel::Mma<T>::run(s[nt], qf[kk], b[0], b[1]);
              mlxcel::Mma<T>::run(odd, qf[kk + 1], b[2], b[3]);
            }
            #pragma unroll
            for (int c = 0; c < 4; ++c) s[nt][c] += odd[c];'''


def split_chains(source: str) -> str:
    assert source.count(OLD) == 1
    return source.replace(OLD, NEW)
