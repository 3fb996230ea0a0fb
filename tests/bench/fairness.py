#!/usr/bin/env python3
"""A long job from one client address beside a small one from another.

Usage: start attnd (e.g. build/attnd --listen 127.0.0.1:18090), then
    /usr/bin/python3 tests/bench/fairness.py 18090
Client A (127.0.0.2) posts one FP16 job of N = 131072, D = 1 (1.7e10 score
pairs); half a second later client B (127.0.0.3) posts a 4 x 8 one. Prints
when each was answered, in seconds from A's send: a fair server answers B
while A still runs. Not a test (it measures time): a benchmark to read.
"""
import numpy as np
import socket, json, struct, time, threading, sys
P=int(sys.argv[1]); N=131072
def st(tensors):
    hdr={}; off=0; blobs=[]
    for k,a in tensors.items():
        b=a.tobytes(); hdr[k]={"dtype":"F16","shape":list(a.shape),"data_offsets":[off,off+len(b)]}; off+=len(b); blobs.append(b)
    h=json.dumps(hdr).encode(); h+=b" "*((8-len(h)%8)%8)
    return struct.pack("<Q",len(h))+h+b"".join(blobs)
rng=np.random.default_rng(0)
big=st({k:rng.standard_normal((N,1)).astype(np.float16) for k in "qkv"})
small=st({k:rng.standard_normal((4,8)).astype(np.float16) for k in "qkv"})
def post(body, src, out, key):
    s=socket.socket(); s.bind((src,0)); s.connect(("127.0.0.1",P))
    s.sendall(b"POST /attention HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/octet-stream\r\nContent-Length: %d\r\n\r\n"%len(body)+body)
    d=s.recv(100); out[key]=(time.time()-t0, d.split(b"\r\n")[0])
out = {}
t0 = time.time()
ta=threading.Thread(target=post,args=(big,"127.0.0.2",out,"A")); ta.start()
time.sleep(0.5)
tb=threading.Thread(target=post,args=(small,"127.0.0.3",out,"B")); tb.start()
ta.join(); tb.join()
print("A (long) answered at %.3f s: %s" % (out["A"][0], out["A"][1].decode()))
print("B (small, sent at 0.5 s) answered at %.3f s: %s" % (out["B"][0], out["B"][1].decode()))
