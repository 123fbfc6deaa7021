"""FP8 wgmma accumulator model (wgmma-fp8-notes.md section 7) applied to dP = dO . V over the head
dim (K = 128): four K = 32 steps chained in one accumulator (the kernels before the FP32 promotion)
versus each step in fresh registers and the four steps summed in FP32 (mma_qk_f32sum). Inputs:
E4M3-rounded N(0, 1) vectors scaled to the top of the E4M3 range, 4000 dot products.
Run: python3 bench/fp8_acc_model.py (needs numpy). Prints the relative RMS error and bias of dP."""
import numpy as np, math
rng=np.random.default_rng(0)
def e4m3(x):
    # round to e4m3 grid (RNE approx via numpy), values of normal inputs scaled to amax 448
    a=np.abs(x); e=np.floor(np.log2(np.maximum(a,2**-9))); e=np.maximum(e,-6)
    q=2.0**(e-3); return np.sign(x)*np.minimum(np.round(a/q)*q,448)
def expo(x):  # unbiased exponent, subnormal -> -6
    a=np.abs(x); return np.where(a>0, np.maximum(np.floor(np.log2(np.where(a>0,a,1))),-6), -1000)
def trunc(x, q): return np.trunc(x/q)*q
def step(acc, a, b):
    prods=a*b
    ea=expo(a)+expo(b); ea=np.where((a==0)|(b==0),-1000,ea)
    eacc=np.floor(np.log2(abs(acc))) if acc!=0 else -1000
    emax=max(eacc, ea.max()); q=2.0**(emax-13)
    s=trunc(acc,q)+trunc(prods,q).sum()
    if s==0: return 0.0
    lead=math.floor(math.log2(abs(s))); return float(np.float32(trunc(s,2.0**(lead-13))))
N=4000; ech=[];epr=[];mag=[]
for _ in range(N):
    s=rng.normal(size=128)*(448/4); t=rng.normal(size=128)*(448/4)
    a=e4m3(s); b=e4m3(t); ex=float(np.dot(a,b))
    acc=0.0
    for k in range(4): acc=step(acc,a[32*k:32*k+32],b[32*k:32*k+32])
    pr=np.float32(0)
    for k in range(4): pr=np.float32(pr+np.float32(step(0.0,a[32*k:32*k+32],b[32*k:32*k+32])))
    ech.append(acc-ex); epr.append(float(pr)-ex); mag.append(ex)
ech=np.array(ech);epr=np.array(epr);mag=np.array(mag)
print("rms err chained / rms dP:", np.sqrt((ech**2).mean())/np.sqrt((mag**2).mean()), "mean bias", ech.mean()/np.sqrt((mag**2).mean()))
print("rms err promoted / rms dP:", np.sqrt((epr**2).mean())/np.sqrt((mag**2).mean()), "mean bias", epr.mean()/np.sqrt((mag**2).mean()))
print("corr(err, dP) chained", np.corrcoef(ech,mag)[0,1], "promoted", np.corrcoef(epr,mag)[0,1])
