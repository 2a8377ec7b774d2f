/* Fused CPU kernels of the decoder's hot loop (captioner/fast/kernels/__init__.py loads them).

   1. Additive attention scores, the f_att of Xu et al. 2015 Eq. (4):

       e[n, l] = sum_a v[a] * tanh(p[m, l, a] + q[n, a]),   m = n / G

   p (M, L, A) the projected keys W a_i (+ bias), q (N = M*G, A) the projected queries U h (row stride
   q_stride), v (A), e (N, L). One pass over p per query row, the (N, L, A) hidden layer never stored.
   The backward recomputes tanh instead of keeping the hidden layer:
       d[n, l, a] = de[n, l] v[a] (1 - tanh^2),  dp[m, l] = sum_g d,  dq[n] = sum_l d,
       dv_rows[m] = sum_g sum_l de[n, l] tanh(...)   (the caller sums the M rows: a fixed order).
   Every output element is computed by one thread in a fixed order, so results do not depend on the
   thread count.
   2. The searches' read of a step's logits (row_best_log_probs, below).
   3. A decoding step's LSTM cell (lstm_cell, below).
   Built at first use with the system C compiler (-O3 -march=native -fopenmp), no -ffast-math. */
#include <math.h>
#include <stdint.h>
#include <string.h>

/* glibc's libmvec vector tanhf and expf (glibc >= 2.35), declared so the loops vectorize without -ffast-math. */
__attribute__((__simd__("notinbranch"))) extern float tanhf(float);
__attribute__((__simd__("notinbranch"))) extern float expf(float);

void additive_scores(const float *p, const float *q, int64_t q_stride, const float *v, float *e,
                     int64_t M, int64_t G, int64_t L, int64_t A, int threads)
{
    #pragma omp parallel for num_threads(threads) schedule(static) collapse(2)
    for (int64_t m = 0; m < M; m++) {
        for (int64_t g = 0; g < G; g++) {
            const int64_t n = m * G + g;
            const float *qn = q + n * q_stride;
            for (int64_t l = 0; l < L; l++) {
                const float *pl = p + (m * L + l) * A;
                float acc = 0.0f;
                #pragma omp simd reduction(+:acc)
                for (int64_t a = 0; a < A; a++)
                    acc += v[a] * tanhf(pl[a] + qn[a]);
                e[n * L + l] = acc;
            }
        }
    }
}

void additive_scores_backward(const float *p, const float *q, int64_t q_stride, const float *v,
                              const float *de, float *dp, float *dq, float *dv_rows,
                              int64_t M, int64_t G, int64_t L, int64_t A, int threads)
{
    #pragma omp parallel for num_threads(threads) schedule(static)
    for (int64_t m = 0; m < M; m++) {
        float *dvm = dv_rows + m * A;
        float *dpm = dp + m * L * A;
        memset(dvm, 0, (size_t)A * sizeof(float));
        memset(dpm, 0, (size_t)(L * A) * sizeof(float));
        for (int64_t g = 0; g < G; g++) {
            const int64_t n = m * G + g;
            const float *qn = q + n * q_stride;
            float *dqn = dq + n * A;
            memset(dqn, 0, (size_t)A * sizeof(float));
            for (int64_t l = 0; l < L; l++) {
                const float *pl = p + (m * L + l) * A;
                float *dpl = dpm + l * A;
                const float gl = de[n * L + l];
                #pragma omp simd
                for (int64_t a = 0; a < A; a++) {
                    const float h = tanhf(pl[a] + qn[a]);
                    const float d = gl * v[a] * (1.0f - h * h);
                    dpl[a] += d;
                    dqn[a] += d;
                    dvm[a] += gl * h;
                }
            }
        }
    }
}

/* The searches' read of a step's logits (search.Logits.best): each row's k largest logits other than the
   `banned` ids, best first, as log-probabilities, the banned words still counted in the normaliser. The
   logits are x[r, v] + b[v] (b: the output layer's bias, rounded once as an add would; zeros for none):

       values[r, j] = y[r, ids[r, j]] - (max_v y[r, v] + log sum_v exp(y[r, v] - max_v y[r, v])),  y = x + b

   Two passes over a row: the top k (a block of BLOCK columns is looked at word by word only when its
   maximum, a vectorized pass, beats the current k-th best; the row's maximum is then the best word's or a
   banned one's), then the sum of exponentials. Ties keep the lower id first.
   A row whose normaliser is not finite (NaN or infinite logits) or with fewer than k eligible words gets
   ids[r, 0] = -1: the caller then takes its PyTorch path. */
static int is_banned(int64_t v, const int64_t *banned, int64_t nb)
{
    for (int64_t b = 0; b < nb; b++)
        if (banned[b] == v) return 1;
    return 0;
}

#define BLOCK 64

void row_best_log_probs(const float *x, const float *bias, int64_t N, int64_t V, int64_t k, const int64_t *banned,
                        int64_t nb, float *values, int64_t *ids, int threads)
{
    #pragma omp parallel for num_threads(threads) schedule(static)
    for (int64_t r = 0; r < N; r++) {
        const float *row = x + r * V;
        float *val = values + r * k;
        int64_t *idx = ids + r * k;
        int64_t filled = 0;
        for (int64_t j = 0; j < k; j++) { val[j] = -INFINITY; idx[j] = -1; }
        for (int64_t c = 0; c < V; c += BLOCK) {
            const int64_t end = c + BLOCK < V ? c + BLOCK : V;
            if (filled == k) {
                float m = -INFINITY;  /* NaN logits never win here, nor below: such rows fail isfinite(lse) */
                #pragma omp simd reduction(max:m)
                for (int64_t v = c; v < end; v++) {
                    const float y = row[v] + bias[v];
                    m = y > m ? y : m;
                }
                if (!(m > val[k - 1])) continue;
            }
            for (int64_t v = c; v < end; v++) {
                const float y = row[v] + bias[v];
                if ((filled == k && !(y > val[k - 1])) || is_banned(v, banned, nb)) continue;
                int64_t j = filled < k ? filled++ : k - 1;
                while (j > 0 && val[j - 1] < y) { val[j] = val[j - 1]; idx[j] = idx[j - 1]; j--; }
                val[j] = y;
                idx[j] = v;
            }
        }
        float top = val[0];  /* the row's maximum: the best eligible word's, or a banned word's */
        for (int64_t b = 0; b < nb; b++)
            if (banned[b] >= 0 && banned[b] < V && row[banned[b]] + bias[banned[b]] > top)
                top = row[banned[b]] + bias[banned[b]];
        float total = 0.0f;
        #pragma omp simd reduction(+:total)
        for (int64_t v = 0; v < V; v++)
            total += expf((row[v] + bias[v]) - top);
        const float lse = top + logf(total);
        if (filled < k || !isfinite(lse)) { idx[0] = -1; continue; }
        for (int64_t j = 0; j < k; j++) val[j] -= lse;
    }
}

/* 3. The LSTM cell of a decoding step (FastShowAttendTellDecoder._recur_fast without autograd), one pass per row:

       beta = sigmoid(gate_logit[n])   (1 without the gate: gate_logit NULL)
       gates = a + b + beta z[:, :4H]  (or gates = a: b and z both NULL), blocks i, f, g, o of H each
       c = sigmoid(f) c_prev + sigmoid(i) tanh(g),   h = sigmoid(o) tanh(c)
       zl = beta z[:, 4H:4H+E]         (E > 0: the projected values' L_z z, for the deep output)

   instead of about ten PyTorch ops that each write an (N, H)..(N, 4H + E) tensor. */
static inline float sigmoidf(float x) { return 1.0f / (1.0f + expf(-x)); }

static inline void cell(float gi, float gf, float gg, float go, float c_prev, float *h, float *c)
{
    const float cj = sigmoidf(gf) * c_prev + sigmoidf(gi) * tanhf(gg);
    *c = cj;
    *h = sigmoidf(go) * tanhf(cj);
}

void lstm_cell(const float *a, int64_t a_stride, const float *b, int64_t b_stride, const float *z, int64_t z_stride,
               const float *gate_logit, int64_t g_stride, const float *c_prev, float *h_out, float *c_out,
               float *zl_out, int64_t N, int64_t H, int64_t E, int threads)
{
    #pragma omp parallel for num_threads(threads) schedule(static)
    for (int64_t n = 0; n < N; n++) {
        const float *an = a + n * a_stride, *cn = c_prev + n * H;
        float *hn = h_out + n * H, *cout = c_out + n * H;
        if (!b) {
            #pragma omp simd
            for (int64_t j = 0; j < H; j++)
                cell(an[j], an[H + j], an[2 * H + j], an[3 * H + j], cn[j], hn + j, cout + j);
            continue;
        }
        const float beta = gate_logit ? sigmoidf(gate_logit[n * g_stride]) : 1.0f;
        const float *bn = b + n * b_stride, *zn = z + n * z_stride;
        #pragma omp simd
        for (int64_t j = 0; j < H; j++)
            cell((an[j] + bn[j]) + beta * zn[j], (an[H + j] + bn[H + j]) + beta * zn[H + j],
                 (an[2 * H + j] + bn[2 * H + j]) + beta * zn[2 * H + j],
                 (an[3 * H + j] + bn[3 * H + j]) + beta * zn[3 * H + j], cn[j], hn + j, cout + j);
        #pragma omp simd
        for (int64_t e = 0; e < E; e++)
            zl_out[n * E + e] = beta * zn[4 * H + e];
    }
}
