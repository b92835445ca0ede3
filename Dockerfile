# syntax=docker/dockerfile:1
FROM golang:1.26-bookworm AS build
RUN apt-get update -qq && apt-get install -y -qq --no-install-recommends libzmq3-dev pkg-config && rm -rf /var/lib/apt/lists/*
WORKDIR /src
COPY go.mod go.sum ./
RUN go mod download
COPY . .
# --version and conductor_build_info report these, e.g.
# docker build --build-arg VERSION=$(git describe --tags --always) --build-arg COMMIT=$(git rev-parse HEAD) .
ARG VERSION=devel
ARG COMMIT=unknown
RUN CGO_ENABLED=1 go build -trimpath -buildvcs=false \
	-ldflags="-s -w -X github.com/mooncake-conductor-go/conductor/internal/buildinfo.version=${VERSION} -X github.com/mooncake-conductor-go/conductor/internal/buildinfo.commit=${COMMIT}" \
	-o /out/conductor .

FROM debian:bookworm-slim
RUN apt-get update -qq && apt-get install -y -qq --no-install-recommends libzmq5 ca-certificates && rm -rf /var/lib/apt/lists/* \
	&& useradd --system --uid 10001 --home-dir /home/conductor --create-home conductor
COPY --from=build /out/conductor /usr/local/bin/conductor
USER conductor
EXPOSE 13333
ENTRYPOINT ["/usr/local/bin/conductor"]
