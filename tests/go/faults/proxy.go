package faults

import (
	"io"
	"net"
	"sync"
)

// Proxy is a TCP proxy in front of Redis, one per replica, so that one replica can be cut from
// Redis while the others keep it. Our own ~100 lines rather than Toxiproxy: no extra server
// process to build, start and drive over its API, the cut is synchronous (when SetCut(true)
// returns, every connection is closed and new ones are refused), and the only states needed are
// pass and cut.
type Proxy struct {
	name   string
	target string
	ln     net.Listener

	mu    sync.Mutex
	cut   bool
	conns map[net.Conn]struct{}
	done  bool
}

func newProxy(name, target string) (*Proxy, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	p := &Proxy{name: name, target: target, ln: ln, conns: map[net.Conn]struct{}{}}
	go p.accept()
	return p, nil
}

func (p *Proxy) Addr() string { return p.ln.Addr().String() }

func (p *Proxy) accept() {
	for {
		c, err := p.ln.Accept()
		if err != nil {
			return
		}
		p.mu.Lock()
		if p.cut || p.done {
			// Refused: accepted then closed at once, as a client sees a reset.
			p.mu.Unlock()
			c.Close()
			continue
		}
		p.conns[c] = struct{}{}
		p.mu.Unlock()
		go p.serve(c)
	}
}

func (p *Proxy) serve(c net.Conn) {
	u, err := net.Dial("tcp", p.target)
	if err != nil {
		p.drop(c)
		return
	}
	p.mu.Lock()
	if p.cut || p.done {
		p.mu.Unlock()
		u.Close()
		p.drop(c)
		return
	}
	p.conns[u] = struct{}{}
	p.mu.Unlock()
	var wg sync.WaitGroup
	wg.Add(2)
	pipe := func(dst, src net.Conn) {
		defer wg.Done()
		io.Copy(dst, src)
		// One direction ended: end both, so that neither side hangs half open.
		dst.Close()
		src.Close()
	}
	go pipe(u, c)
	go pipe(c, u)
	wg.Wait()
	p.drop(c)
	p.drop(u)
}

func (p *Proxy) drop(c net.Conn) {
	c.Close()
	p.mu.Lock()
	delete(p.conns, c)
	p.mu.Unlock()
}

// SetCut(true) closes every connection through the proxy and refuses new ones until
// SetCut(false).
func (p *Proxy) SetCut(cut bool) {
	p.mu.Lock()
	p.cut = cut
	var open []net.Conn
	if cut {
		for c := range p.conns {
			open = append(open, c)
		}
	}
	p.mu.Unlock()
	for _, c := range open {
		c.Close()
	}
}

func (p *Proxy) Close() {
	p.mu.Lock()
	p.done = true
	p.mu.Unlock()
	p.SetCut(true)
	p.ln.Close()
}
