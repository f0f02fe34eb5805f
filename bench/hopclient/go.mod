module kube-peer-proxy/bench/hopclient

go 1.22
