# Service-account key sync on Kubernetes control-plane hosts.
#
#   class { 'sa_key_sync': etcd_endpoints => ['https://10.0.0.1:2379', 'https://10.0.0.2:2379'] }
#
# Every master publishes its own public key; confd renders all of them into
# /etc/kubernetes/pki/sa-bundle.pem and restarts kube-apiserver through
# kube-apiserver-safe-restart (one master at a time, under an etcd lock).
# Every kube-apiserver-safe-restart command (the units, confd's reload_cmd,
# the runbook's rotate-key) reads /etc/kubernetes/safe-restart.toml.
# The site's kube-apiserver.service names $KUBE_APISERVER_SA_ARGS in its
# ExecStart (the drop-in 20-sa-keys.conf provides the variable).
#
# The module's files/ holds bin/ (confd and kube-apiserver-safe-restart as
# built by `make build`), conf.d/ and templates/ (examples/confd) and
# systemd/ (examples/systemd); its templates/ holds confd.toml.epp and
# safe-restart.toml.epp (examples/puppet).
class sa_key_sync (
  Array[String] $etcd_endpoints,
  String        $etcd_ca   = '/etc/kubernetes/pki/etcd/ca.crt',
  String        $etcd_cert = '/etc/kubernetes/pki/apiserver-etcd-client.crt',
  String        $etcd_key  = '/etc/kubernetes/pki/apiserver-etcd-client.key',
) {
  ['confd', 'kube-apiserver-safe-restart'].each |$b| {
    file { "/usr/local/bin/${b}":
      source => "puppet:///modules/sa_key_sync/bin/${b}",
      mode   => '0755',
    }
  }
  File['/usr/local/bin/confd'] ~> Service['confd']
  # The external signer (docs/signer.md): installed everywhere, enabled only
  # on masters moved to signer mode.
  file { '/usr/local/bin/kube-apiserver-sa-signer':
    source => 'puppet:///modules/sa_key_sync/bin/kube-apiserver-sa-signer',
    mode   => '0755',
  }

  file { ['/etc/confd', '/etc/confd/conf.d', '/etc/confd/templates']:
    ensure => directory,
    mode   => '0755',
  }

  # The one configuration of kube-apiserver-safe-restart (and the signer):
  # etcd as confd reaches it, the restart's preflight and health gate, the
  # key files. examples/safe-restart.toml with this class's etcd settings.
  file { '/etc/kubernetes/safe-restart.toml':
    content => epp('sa_key_sync/safe-restart.toml.epp', {
      nodes => $etcd_endpoints, ca => $etcd_ca, cert => $etcd_cert, key => $etcd_key,
    }),
    mode    => '0600',
  }

  file { '/etc/confd/confd.toml':
    content => epp('sa_key_sync/confd.toml.epp', {
      nodes => $etcd_endpoints, ca => $etcd_ca, cert => $etcd_cert, key => $etcd_key,
    }),
    mode    => '0600',
    notify  => Service['confd'],
  }

  # Resources and templates exactly as in examples/confd of this repository.
  # Earlier versions of these examples had the bundle first; two resources
  # rendering one destination would fight.
  file { ['/etc/confd/conf.d/10-sa-bundle.toml', '/etc/confd/conf.d/20-apiserver-sa-flags.toml']:
    ensure => absent,
    notify => Service['confd'],
  }
  ['10-apiserver-sa-flags.toml', '20-sa-bundle.toml'].each |$f| {
    file { "/etc/confd/conf.d/${f}":
      source => "puppet:///modules/sa_key_sync/conf.d/${f}",
      notify => Service['confd'],
    }
  }
  ['sa-bundle.pem.tmpl', 'apiserver-sa.env.tmpl'].each |$f| {
    file { "/etc/confd/templates/${f}":
      source => "puppet:///modules/sa_key_sync/templates/${f}",
      notify => Service['confd'],
    }
  }

  ['confd.service', 'kube-apiserver-safe-restart.service', 'sa-key-publish.service',
    'sa-key-retire.service', 'sa-key-retire.timer', 'kube-apiserver-sa-signer.service'].each |$u| {
    file { "/etc/systemd/system/${u}":
      source => "puppet:///modules/sa_key_sync/systemd/${u}",
      notify => Exec['sa_key_sync-daemon-reload'],
    }
  }
  # kube-apiserver waits until every other master trusts this master's key
  # (a reimaged host); see the README's rotation runbook for a first master.
  file { '/etc/systemd/system/kube-apiserver.service.d':
    ensure => directory,
    mode   => '0755',
  }
  ['10-wait-trusted.conf', '20-sa-keys.conf'].each |$d| {
    file { "/etc/systemd/system/kube-apiserver.service.d/${d}":
      source => "puppet:///modules/sa_key_sync/systemd/kube-apiserver.service.d/${d}",
      notify => Exec['sa_key_sync-daemon-reload'],
    }
  }
  exec { 'sa_key_sync-daemon-reload':
    command     => '/bin/systemctl daemon-reload',
    refreshonly => true,
  }

  service { 'confd':
    ensure  => running,
    enable  => true,
    require => [Exec['sa_key_sync-daemon-reload'], File['/usr/local/bin/kube-apiserver-safe-restart'], File['/etc/kubernetes/safe-restart.toml']],
  }
  # The publisher runs for good (publish-key --watch): it publishes at
  # start and whenever the key files or etcd's copy change, so it is kept
  # running and restarted when its unit, binary or configuration change.
  service { 'sa-key-publish.service':
    ensure    => running,
    enable    => true,
    require   => Exec['sa_key_sync-daemon-reload'],
    subscribe => [File['/etc/systemd/system/sa-key-publish.service'], File['/usr/local/bin/kube-apiserver-safe-restart'], File['/etc/kubernetes/safe-restart.toml']],
  }
  # The path unit of earlier versions: the service watches the files itself.
  service { 'sa-key-publish.path':
    ensure => stopped,
    enable => false,
  }
  file { '/etc/systemd/system/sa-key-publish.path':
    ensure  => absent,
    require => Service['sa-key-publish.path'],
    notify  => Exec['sa_key_sync-daemon-reload'],
  }

  # Retires superseded service-account keys (any host's) once their grace is over.
  service { 'sa-key-retire.timer':
    ensure  => running,
    enable  => true,
    require => [Exec['sa_key_sync-daemon-reload'], File['/usr/local/bin/kube-apiserver-safe-restart']],
  }

  # Other apiserver inputs Puppet manages (flags, certificates) restart it
  # the same safe way: notify this oneshot instead of Service['kube-apiserver'].
  exec { 'kube-apiserver-safe-restart':
    command     => '/bin/systemctl start kube-apiserver-safe-restart.service',
    refreshonly => true,
    timeout     => 2800, # above the unit's TimeoutStartSec=45min
  }
  # Example: file { '/etc/kubernetes/apiserver.env': ..., notify => Exec['kube-apiserver-safe-restart'] }
  # (name such a file in safe-restart.toml's preflight-flags-file to have
  # it checked before the restart).
}
